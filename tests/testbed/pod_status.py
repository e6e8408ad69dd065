"""The pod status a kubelet reports, as strategic-merge patches for pods/status (pure).

Only the first container runs (see node_agent.py), so only it appears in
containerStatuses. A running container is ready once it has started (its startup probe
passed, or it has none) and its readiness probe passed (or it has none): pod_probes.py.
containerStatuses is an atomic list, so every patch carries the container's whole status.
"""
from __future__ import annotations

import datetime

TERMINATION_MESSAGE_LIMIT = 4096  # the kubelet reads at most this much of the file
FALLBACK_LOG_LINES = 80  # FallbackToLogsOnError: the last 80 lines...
FALLBACK_LOG_BYTES = 2048  # ...or 2 KiB, whichever is shorter


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, status: bool, reason: str | None = None,
               message: str | None = None) -> dict:
    condition = {"type": kind, "status": "True" if status else "False",
                 "lastTransitionTime": now(), "lastProbeTime": None,
                 # A patch names both: null clears what an earlier one set.
                 "reason": reason, "message": message}
    return condition


def _readiness_conditions(container: dict, ready: bool) -> list[dict]:
    """ContainersReady and Ready, worded as the kubelet's (status/generate.go)."""
    if ready:
        return [_condition("ContainersReady", True), _condition("Ready", True)]
    message = f"containers with unready status: [{container['name']}]"
    return [_condition("ContainersReady", False, "ContainersNotReady", message),
            _condition("Ready", False, "ContainersNotReady", message)]


def _container_status(container: dict, state: dict, *, ready: bool, restarts: int,
                      last_state: dict | None = None, container_id: str | None = None,
                      started: bool | None = None) -> dict:
    status = {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "ready": ready,
        "started": ("running" in state) if started is None else started,
        "restartCount": restarts,
        # Strategic merge would keep an old state key next to a new one; null removes it.
        "state": {"waiting": None, "running": None, "terminated": None, **state},
        "lastState": last_state or {},
    }
    if container_id:
        status["containerID"] = container_id
    return status


def waiting_patch(container: dict, host_ip: str, reason: str, message: str) -> dict:
    """ContainerCreating (a volume's ConfigMap is missing, say): still Pending."""
    return {"status": {
        "phase": "Pending",
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": now(),
        "conditions": [_condition("PodReadyToStartContainers", False),
                       _condition("Initialized", True),
                       _condition("ContainersReady", False, "ContainersNotReady"),
                       _condition("Ready", False, "ContainersNotReady")],
        "containerStatuses": [_container_status(
            container, {"waiting": {"reason": reason, "message": message}},
            ready=False, restarts=0)],
    }}


def running_patch(container: dict, *, pod_ip: str, host_ip: str, started_at: str,
                  restarts: int, container_id: str, last_state: dict | None = None,
                  ready: bool = True, started: bool = True) -> dict:
    return {"status": {
        "phase": "Running",
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": started_at,
        "conditions": [_condition("PodReadyToStartContainers", True),
                       _condition("Initialized", True),
                       *_readiness_conditions(container, ready)],
        "containerStatuses": [_container_status(
            container, {"running": {"startedAt": started_at}}, ready=ready,
            restarts=restarts, last_state=last_state, container_id=container_id,
            started=started)],
    }}


def readiness_patch(container: dict, *, started_at: str, restarts: int, container_id: str,
                    last_state: dict | None, ready: bool, started: bool) -> dict:
    """A probe changed the running container's started/ready: only what that changes."""
    return {"status": {
        "conditions": _readiness_conditions(container, ready),
        "containerStatuses": [_container_status(
            container, {"running": {"startedAt": started_at}}, ready=ready,
            restarts=restarts, last_state=last_state, container_id=container_id,
            started=started)],
    }}


def terminated_state(exit_code: int, reason: str, message: str, started_at: str,
                     finished_at: str, container_id: str) -> dict:
    terminated = {"exitCode": exit_code, "reason": reason, "startedAt": started_at,
                  "finishedAt": finished_at, "containerID": container_id}
    if message:
        terminated["message"] = message
    return {"terminated": terminated}


def terminated_patch(container: dict, state: dict, *, restarts: int, final: bool,
                     last_state: dict | None = None) -> dict:
    """``final``: restartPolicy says no restart, so the pod phase ends too."""
    exit_code = state["terminated"]["exitCode"]
    patch = {"status": {
        "conditions": [_condition("ContainersReady", False, "PodCompleted" if final else
                                  "ContainersNotReady"),
                       _condition("Ready", False, "PodCompleted" if final else
                                  "ContainersNotReady")],
        "containerStatuses": [_container_status(container, state, ready=False,
                                                restarts=restarts, last_state=last_state)],
    }}
    if final:
        patch["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        patch["status"]["conditions"].append(_condition("PodReadyToStartContainers", False))
    return patch


def crash_loop_patch(container: dict, *, last_state: dict, restarts: int, delay: float,
                     pod_label: str) -> dict:
    """Waiting out the restart back-off: what a kubelet reports between an exit and the
    delayed restart (the restart count moves when the new container starts)."""
    message = (f"back-off {_go_duration(delay)} restarting failed "
               f"container={container['name']} pod={pod_label}")
    return {"status": {"containerStatuses": [_container_status(
        container, {"waiting": {"reason": "CrashLoopBackOff", "message": message}},
        ready=False, restarts=restarts, last_state=last_state)]}}


def _go_duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


RESTARTING_ALL = "RestartingAllContainers"
RESTART_ALL_STARTED = "RestartAllContainersStarted"
RESTARTING_ALL_MESSAGE = "The container is removed because RestartAllContainers in place"


def all_containers_restarting(status: bool, reason: str | None = None) -> dict:
    """The AllContainersRestarting condition, which a kubelet reports only for pods with a
    RestartAllContainers rule."""
    return _condition("AllContainersRestarting", status, reason,
                      "container exited with restart policy rule" if status else None)


def restarting_all_patch(container: dict, *, restarts: int) -> dict:
    """After a RestartAllContainers exit the kubelet removes the pod's containers; until the
    new ones start each says so (kubelet_pods.go): waiting, one more restart counted, and a
    last state that names the reset, not the exit code (that was in the terminated state
    reported just before)."""
    removed = {"terminated": {"exitCode": 137, "reason": RESTARTING_ALL,
                              "message": RESTARTING_ALL_MESSAGE}}
    return {"status": {"containerStatuses": [_container_status(
        container, {"waiting": {"reason": RESTARTING_ALL, "message": RESTARTING_ALL_MESSAGE}},
        ready=False, restarts=restarts, last_state=removed)]}}


def failed_to_start_patch(container: dict, host_ip: str, message: str) -> dict:
    """A pod the agent cannot run at all: Failed at once, saying why, so a test fails fast
    with the reason instead of timing out on a pod that stays Pending."""
    state = terminated_state(128, "StartError", message, now(), now(), "")
    patch = terminated_patch(container, state, restarts=0, final=True)
    patch["status"].update({"hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
                            "reason": "UnsupportedByTestbed", "message": message})
    return patch


def exit_reason(exit_code: int) -> str:
    return "Completed" if exit_code == 0 else "Error"


def termination_message(message_file_content: bytes, log_tail: bytes, *, exit_code: int,
                        policy: str) -> str:
    message = message_file_content[:TERMINATION_MESSAGE_LIMIT].decode(errors="replace")
    if not message.strip() and exit_code != 0 and policy == "FallbackToLogsOnError":
        lines = log_tail.splitlines()[-FALLBACK_LOG_LINES:]
        message = b"\n".join(lines)[-FALLBACK_LOG_BYTES:].decode(errors="replace")
    return message
