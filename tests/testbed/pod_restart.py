"""Whether and when an exited container starts again, as the v1.36 kubelet decides (pure).

Container restart rules (KEP-5307, ContainerRestartRules, beta and on since 1.35): a regular
container may set its own ``restartPolicy`` (Never, OnFailure, Always) and, with it,
``restartPolicyRules``: on exit the first rule whose ``exitCodes`` match (operator In or NotIn
the values) decides; no match: the container's restartPolicy, else the pod's
(pkg/api/v1/pod ContainerShouldRestart). The rules apply only where the container sets a
restartPolicy (the API server refuses rules without one).

Actions: ``Restart`` restarts that container in place; ``RestartAllContainers``
(KEP-5532, RestartAllContainersOnContainerExits, beta and on in 1.36) restarts every
container of the pod in place, init containers again too (the test bed runs one container
and no init containers, so for it both restart the one container; the status differs, see
pod_status.py).

Back-off (pkg/kubelet: flowcontrol.Backoff, initial 10 s, max 300 s): the first restart is
immediate; each later one waits 10 s, 20 s, 40 s, ... up to 300 s after the exit, and the
delay starts over at the first step once a container has run for 10 minutes since its last
restart. (ReduceDefaultCrashLoopBackOffDecay, 1 s initial and 60 s max, is alpha and off in
1.36.) A RestartAllContainers restart removes the containers, so the kubelet finds no exited
container to back off from: it restarts at once, every time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

RESTART = "Restart"
RESTART_ALL = "RestartAllContainers"
INITIAL_BACKOFF_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 300.0  # the kubelet's MaxContainerBackOff (crashLoopBackOff default)
BACKOFF_RESET_SECONDS = 600.0  # a run this long since the last restart resets the delay


def matching_rule(container: dict, exit_code: int) -> dict | None:
    """The first of the container's restartPolicyRules that matches ``exit_code``."""
    for rule in container.get("restartPolicyRules") or []:
        codes = rule.get("exitCodes")
        if not codes:
            continue
        listed = exit_code in (codes.get("values") or [])
        operator = codes.get("operator")
        if (operator == "In" and listed) or (operator == "NotIn" and not listed):
            return rule
    return None


def restart_action(container: dict, pod_spec: dict, exit_code: int) -> str | None:
    """``Restart``, ``RestartAllContainers`` or None (the container stays terminated)."""
    policy = container.get("restartPolicy")
    if policy is not None:
        rule = matching_rule(container, exit_code)
        if rule is not None and rule.get("action") in (RESTART, RESTART_ALL):
            return rule["action"]
        if policy == "Always" or (policy == "OnFailure" and exit_code != 0):
            return RESTART
        if policy in ("Never", "OnFailure"):
            return None
    pod_policy = pod_spec.get("restartPolicy", "Always")
    if pod_policy == "Never" or (pod_policy == "OnFailure" and exit_code == 0):
        return None
    return RESTART


@dataclass
class CrashLoopBackOff:
    """The kubelet's per-container restart delay."""

    initial: float = INITIAL_BACKOFF_SECONDS
    maximum: float = MAX_BACKOFF_SECONDS
    reset_after: float = BACKOFF_RESET_SECONDS
    _backoff: float | None = field(default=None, repr=False)
    _last_restart: float = field(default=0.0, repr=False)

    def delay(self, finished_at: float) -> float:
        """Seconds to wait after an exit at ``finished_at`` (a monotonic time) before the
        restart; records that restart."""
        if self._backoff is None or finished_at - self._last_restart > self.reset_after:
            self._backoff, wait = self.initial, 0.0
        else:
            wait = self._backoff
            self._backoff = min(self._backoff * 2, self.maximum)
        self._last_restart = finished_at + wait
        return wait
