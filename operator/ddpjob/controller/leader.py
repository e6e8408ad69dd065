"""Leader election on a ``coordination.k8s.io/v1`` Lease: of the operator's replicas, one acts.

The semantics are client-go's ``leaderelection`` package (what the Go operators use), so the
timings mean what Kubernetes operators expect (docs/operator.md, "High availability"):

* A replica **acquires** the Lease when nobody holds it, or when the holder has not renewed it
  for ``leaseDurationSeconds`` *as measured on this replica's own clock*: the clock starts when
  this replica sees the Lease record change, never from the ``renewTime`` written in it, so the
  replicas' clocks are never compared.
* The leader **renews** every ``retry_period``; a renewal needs no read first (an update with
  the resourceVersion of its own last write; a conflict falls back to a read).
* A leader that has not renewed for ``renew_deadline`` (shorter than the lease duration)
  **stops acting at once**: the operator exits, so no two replicas ever act. The others wait
  at least ``lease_duration`` from their last sight of a renewal, so there is a gap of
  lease_duration - renew_deadline between the old leader's last possible write and the new
  one's first.
* A leader that stops on purpose (SIGTERM: an upgrade) **releases** the Lease (empty holder,
  duration 1 s), so a standby takes over within one retry period instead of a lease duration.

The decisions are pure functions of the Lease record and the clocks (``observe``,
``held_by_another``, ``claim``); ``LeaderElector`` does the requests through ``LeaseApi``
(``kube.Kube`` over HTTP, a fake in the unit tests), one ``step`` per retry period.
"""
from __future__ import annotations

import datetime as dt
import logging
import random
import secrets
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from ddpjob.controller.kube import ApiError
from ddpjob.controller.settings import OperatorSettings

logger = logging.getLogger("ddpjob.operator.leader")

LEASE_API_VERSION = "coordination.k8s.io/v1"
JITTER = 1.2  # client-go's JitterFactor: standbys retry after retry_period * [1, 1.2)
RELEASED_LEASE_SECONDS = 1  # what a release writes: expired for everyone a second later
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "ddpjob-system"


@dataclass(frozen=True)
class LeaseTimings:
    """client-go's defaults for controllers (kube-controller-manager's flags)."""

    lease_duration: float = 15.0
    """How long a standby waits, after it last saw the Lease change, before taking it."""
    renew_deadline: float = 10.0
    """How long a leader keeps acting without a successful renewal."""
    retry_period: float = 2.0
    """How often the leader renews and a standby looks."""

    def __post_init__(self) -> None:
        # client-go's NewLeaderElector checks the same two inequalities.
        if not self.lease_duration > self.renew_deadline:
            raise ValueError(f"the lease duration ({self.lease_duration:g}s) must be longer than the "
                             f"renew deadline ({self.renew_deadline:g}s)")
        if not self.renew_deadline > JITTER * self.retry_period:
            raise ValueError(f"the renew deadline ({self.renew_deadline:g}s) must be longer than "
                             f"{JITTER:g} x the retry period ({self.retry_period:g}s)")


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec, as client-go's LeaderElectionRecord: who holds it and since when."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0

    @classmethod
    def from_lease(cls, lease: dict) -> "LeaseRecord":
        spec = lease.get("spec") or {}
        return cls(holder=str(spec.get("holderIdentity") or ""),
                   lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=str(spec.get("acquireTime") or ""), renew_time=str(spec.get("renewTime") or ""),
                   transitions=int(spec.get("leaseTransitions") or 0))

    def to_spec(self) -> dict:
        spec: dict[str, Any] = {"holderIdentity": self.holder, "leaseDurationSeconds": self.lease_duration_seconds,
                                "leaseTransitions": self.transitions}
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return spec


@dataclass(frozen=True)
class Observation:
    """A Lease record and when (this replica's monotonic clock) it was first seen as it is."""

    record: LeaseRecord
    since: float


def micro_time(now: dt.datetime) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, UTC."""
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------------------------
# The decisions (pure)
# ---------------------------------------------------------------------------------------------
def observe(previous: Optional[Observation], record: LeaseRecord, now: float) -> Observation:
    """The local clock of a record restarts only when the record changes: a holder that stopped
    renewing leaves the same record behind, and its lease runs out on our clock."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def held_by_another(observation: Observation, identity: str, now: float) -> bool:
    """Someone else holds the Lease and, by our clock, its lease has not run out."""
    record = observation.record
    return (bool(record.holder) and record.holder != identity
            and now < observation.since + record.lease_duration_seconds)


def claim(current: Optional[LeaseRecord], identity: str, lease_duration: float,
          wall_now: dt.datetime) -> LeaseRecord:
    """The record a replica writes to hold the Lease: a renewal keeps the acquire time and the
    transition count; a takeover starts a new term and counts one more transition."""
    now = micro_time(wall_now)
    duration = int(round(lease_duration))
    if current is not None and current.holder == identity:
        return replace(current, lease_duration_seconds=duration, renew_time=now,
                       acquire_time=current.acquire_time or now)
    transitions = current.transitions + 1 if current is not None else 0
    return LeaseRecord(holder=identity, lease_duration_seconds=duration, acquire_time=now, renew_time=now,
                       transitions=transitions)


def released(current: LeaseRecord, wall_now: dt.datetime) -> LeaseRecord:
    """What a leader that stops on purpose writes (client-go's ReleaseOnCancel)."""
    now = micro_time(wall_now)
    return LeaseRecord(holder="", lease_duration_seconds=RELEASED_LEASE_SECONDS, acquire_time=now,
                       renew_time=now, transitions=current.transitions)


def lease_body(namespace: str, name: str, record: LeaseRecord, resource_version: Optional[str] = None) -> dict:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": {"app.kubernetes.io/name": "ddpjob-operator"}}
    if resource_version:
        metadata["resourceVersion"] = resource_version  # optimistic concurrency: 409 if it moved
    return {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": metadata, "spec": record.to_spec()}


# ---------------------------------------------------------------------------------------------
# The elector (the requests; one step per retry period)
# ---------------------------------------------------------------------------------------------
class LeaseApi(Protocol):
    """The three Lease requests (``kube.Kube`` implements them)."""

    def get_lease(self, namespace: str, name: str, *, timeout: float) -> Optional[dict]: ...

    def create_lease(self, lease: dict, *, timeout: float) -> dict: ...

    def replace_lease(self, lease: dict, *, timeout: float) -> dict: ...


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class LeaderElector:
    """Holds the Lease ``namespace/name`` for ``identity`` while it can.

    ``step()`` is one round (acquire or renew); ``run(stop)`` repeats it every retry period in
    the caller's thread. ``on_started`` is called (from that thread) when this replica becomes
    the leader, ``on_stopped`` when it can no longer be sure it is one: it must stop acting at
    once. ``is_leader()`` says whether it may act right now, by the same deadline, and is what
    every write of the operator checks (``kube.Kube.fence``)."""

    def __init__(self, api: LeaseApi, namespace: str, name: str, identity: str,
                 timings: LeaseTimings = LeaseTimings(), *,
                 on_started: Callable[[], None] = lambda: None, on_stopped: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], dt.datetime] = _utc_now,
                 jitter: Callable[[], float] = random.random):
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.timings = timings
        self.on_started, self.on_stopped = on_started, on_stopped
        self.clock, self.wall, self.jitter = clock, wall, jitter
        self.observed: Optional[Observation] = None
        self.resource_version: Optional[str] = None  # of our own last write
        self.leading = False
        self.renewed_at: Optional[float] = None  # when the last successful renewal was sent
        self._last_problem = ""

    # -- state ----------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        renewed = self.renewed_at
        return self.leading and renewed is not None and self.clock() < renewed + self.timings.renew_deadline

    @property
    def holder(self) -> str:
        return self.observed.record.holder if self.observed is not None else ""

    # -- one round ------------------------------------------------------------------------------
    def step(self) -> None:
        sent = self.clock()
        acquired = self.try_acquire_or_renew(sent)
        if acquired:
            self.renewed_at = sent
            if not self.leading:
                self.leading = True
                logger.info("%s: became the leader (Lease %s/%s)", self.identity, self.namespace, self.name)
                self.on_started()
            return
        if not self.leading:
            return
        taken = self.observed is not None and self.holder not in ("", self.identity)
        if taken or self.clock() >= (self.renewed_at or sent) + self.timings.renew_deadline:
            self.leading = False
            why = (f"the Lease is now held by {self.holder}" if taken else
                   f"no renewal succeeded within the renew deadline ({self.timings.renew_deadline:g}s)")
            logger.critical("%s: lost the leadership: %s", self.identity, why)
            self.on_stopped()

    def try_acquire_or_renew(self, now: float) -> bool:
        timeout = self._request_timeout(now)
        if self.leading and self.observed is not None and self.resource_version:
            # The fast path: a leader's renewal assumes its own last write is current.
            record = claim(self.observed.record, self.identity, self.timings.lease_duration, self.wall())
            try:
                self._wrote(self.api.replace_lease(self._body(record, self.resource_version), timeout=timeout),
                            record, now)
                return True
            except ApiError as exc:
                if exc.status != 409:
                    self._problem(f"renewing the Lease failed: {exc}")
                    return False
                # Conflict: someone else wrote; read it and decide again.
        try:
            lease = self.api.get_lease(self.namespace, self.name, timeout=timeout)
        except ApiError as exc:
            self._problem(f"reading the Lease failed: {exc}")
            return False
        if lease is None:
            record = claim(None, self.identity, self.timings.lease_duration, self.wall())
            try:
                self._wrote(self.api.create_lease(self._body(record), timeout=timeout), record, now)
                return True
            except ApiError as exc:
                self._problem(f"creating the Lease failed: {exc}")
                return False
        record = LeaseRecord.from_lease(lease)
        self.observed = observe(self.observed, record, self.clock())
        if held_by_another(self.observed, self.identity, self.clock()):
            self._last_problem = ""
            return False
        mine = claim(record, self.identity, self.timings.lease_duration, self.wall())
        version = (lease.get("metadata") or {}).get("resourceVersion")
        try:
            self._wrote(self.api.replace_lease(self._body(mine, version), timeout=timeout), mine, now)
            return True
        except ApiError as exc:
            if exc.status != 409:  # a conflict is another replica winning the race: no news
                self._problem(f"taking the Lease failed: {exc}")
            return False

    def release(self) -> bool:
        """Give the Lease up (a graceful stop): a standby takes over within a retry period.
        Only while still the leader, and only from our own last write (never someone else's)."""
        if not self.is_leader() or self.observed is None or not self.resource_version:
            return False
        record = released(self.observed.record, self.wall())
        try:
            self.api.replace_lease(self._body(record, self.resource_version),
                                   timeout=self._request_timeout(self.clock()))
        except ApiError as exc:
            logger.warning("%s: releasing the Lease failed (it expires by itself): %s", self.identity, exc)
            return False
        self.leading = False
        logger.info("%s: released the Lease %s/%s", self.identity, self.namespace, self.name)
        return True

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set; the first waits a retry period (``step`` was called once
        at startup)."""
        while not stop.wait(self.next_delay()):
            try:
                self.step()
            except Exception:  # a bug must not end the rounds: a leader would then keep acting
                logger.exception("%s: leader election round crashed", self.identity)
                if self.leading and not self.is_leader():
                    self.leading = False
                    self.on_stopped()

    def next_delay(self) -> float:
        period = self.timings.retry_period
        return period if self.leading else period * (1 + (JITTER - 1) * self.jitter())

    # -- helpers --------------------------------------------------------------------------------
    def _request_timeout(self, now: float) -> float:
        """A leader's requests may take until its renew deadline (a busy API server queues
        them); a standby's never longer than a renew deadline."""
        if self.leading and self.renewed_at is not None:
            return max(0.5, self.renewed_at + self.timings.renew_deadline - now)
        return self.timings.renew_deadline

    def _body(self, record: LeaseRecord, resource_version: Optional[str] = None) -> dict:
        return lease_body(self.namespace, self.name, record, resource_version)

    def _wrote(self, lease: dict, record: LeaseRecord, now: float) -> None:
        self.observed = Observation(record, now)
        self.resource_version = (lease.get("metadata") or {}).get("resourceVersion")
        self._last_problem = ""

    def _problem(self, message: str) -> None:
        """Logged once per distinct problem, not every retry period."""
        if message != self._last_problem:
            logger.warning("%s: %s", self.identity, message)
            self._last_problem = message


# ---------------------------------------------------------------------------------------------
# The operator's elector, from its settings
# ---------------------------------------------------------------------------------------------
def identity_of(settings: OperatorSettings) -> str:
    """The pod's name (stable across its container's restarts, so a restarted leader takes
    its own Lease back at once); outside a pod, one identity per process."""
    return settings.pod_name or f"{socket.gethostname()}_{secrets.token_hex(4)}"


def lease_namespace(settings: OperatorSettings, service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    if settings.lease_namespace:
        return settings.lease_namespace
    try:
        return service_account_file.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def operator_elector(api: LeaseApi, settings: OperatorSettings, on_started: Callable[[], None],
                     on_stopped: Callable[[], None]) -> LeaderElector:
    timings = LeaseTimings(settings.lease_duration_seconds, settings.renew_deadline_seconds,
                           settings.retry_period_seconds)
    return LeaderElector(api, lease_namespace(settings), settings.lease_name, identity_of(settings), timings,
                         on_started=on_started, on_stopped=on_stopped)
