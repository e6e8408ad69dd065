"""The operator's own watch of its pods: a list, then a watch, each event turned into a
``PodView`` in the ``PodIndex`` the job workers read, and the job woken.

Why not kopf's index, as before: kopf runs every watch event through its per-object machinery
(a task and a queue per object, the cause detection, the handler state, the loggers), and pod
events are two thirds of what the operator receives. With 100 concurrent 4-node jobs that
machinery was most of the operator's CPU (benchmarks/README.md, "CPU per job: the third
round"); here a pod event costs its decoding, one ``view_pod`` and a dict update.

What it keeps of kopf's index:

* **filled before any job is reconciled**: ``wait_ready`` returns once the first list of every
  watched namespace is in the index (``handlers.ddpjob_event`` waits for it), so after an
  operator restart the first pass already sees every existing pod;
* **the same scope** as kopf's watches: the operator's namespaces, or all of them. kopf's
  namespace patterns (``team-*``, ``!*-dev``; ``namespace_matches``) are watched cluster-wide
  and filtered here;
* **the API server filters**: only pods that carry the job label (``names.LABEL_JOB_NAME``).

How it follows the API server: one thread per namespace watched (the Kubernetes client is
blocking; nothing blocking runs on the event loop), each listing, then watching from the list's
resourceVersion with bookmarks, resuming from the last version it saw when a watch ends, and
listing again when that version is too old (410 Gone): the pods the new list lacks are gone.
Errors back off (1 s doubling to 30 s). Every change reaches the event loop through
``call_soon_threadsafe``, where the index is only ever written, so the workers read it without
a lock.

Trust: a pod is anyone's who may create pods in the namespace, label included. The view is the
same bounded ``observation.view_pod`` kopf's index called, each event is bounded in size
(``kube.MAX_WATCH_EVENT_BYTES``), and whose the pod is (its controller owner) is decided by each
pass, as before. What the watch holds of raw pods is bounded by neither their number nor their
size: a list is viewed page by page as ``Kube.list_pods`` reads it (one page, ``kube.LIST_PAGE``
pods, held at a time, and one scope lists at a time), and a watch event is let go of once viewed.
What stays is the index of views, a couple of KiB each; a foreign pod with the job's label keeps
its view there too (a pod with the name of one of the job's is what keeps the job from creating
its gang over it, ``policy.creation.create_gang``), and no pass adopts it (``plan.is_ours``: the
controller owner reference's uid).
"""
from __future__ import annotations

import asyncio
import fnmatch
import logging
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Protocol, Sequence

from ddpjob.api import names
from ddpjob.controller.observation import PodView, view_pod
from ddpjob.controller.kube import ApiError

logger = logging.getLogger("ddpjob.operator")

JobKey = tuple[str, str]  # (namespace, DDPJob name)
# (job, pod uid, its view; None: gone, or no longer one of the job's ranks)
OnChange = Callable[[JobKey, str, Optional[PodView]], None]
SERVER_TIMEOUT_SECONDS = 300  # the API server ends each watch after this; the next resumes
BACKOFF_SECONDS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
QUICK_END_SECONDS = 1.0  # a watch the API server ends sooner is not resumed at once (no busy loop)


class PodSource(Protocol):
    """The two reads the watch makes (``kube.Kube`` over HTTP; a fake in the unit tests)."""

    def list_pods(self, namespace: Optional[str], selector: str) -> tuple[Iterable[dict], str]: ...

    def watch_pods(self, namespace: Optional[str], selector: str, resource_version: str, *,
                   server_timeout: int, stopped: Callable[[], bool]) -> Iterator[dict]: ...


class Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class PodIndex(Mapping[JobKey, list]):
    """(namespace, job name) -> the views of its pods, as the watch last saw them. Written only on
    the event loop (``PodWatch`` hands every change there); read there by the job workers."""

    def __init__(self) -> None:
        self._jobs: dict[JobKey, dict[str, PodView]] = {}
        self._where: dict[str, JobKey] = {}  # pod uid -> its job

    def __getitem__(self, key: JobKey) -> list[PodView]:
        return list(self._jobs[key].values())

    def __iter__(self) -> Iterator[JobKey]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def put(self, key: JobKey, uid: str, view: Optional[PodView]) -> None:
        """The pod ``uid`` is now ``view`` in job ``key`` (None: drop it)."""
        before = self._where.pop(uid, None)
        if before is not None:
            pods = self._jobs.get(before)
            if pods is not None:
                pods.pop(uid, None)
                if not pods:
                    del self._jobs[before]
        if view is not None:
            self._jobs.setdefault(key, {})[uid] = view
            self._where[uid] = key

    def uids(self, namespace: Optional[str]) -> dict[str, JobKey]:
        """The pods held of ``namespace`` (None: all), uid -> job."""
        return {uid: key for uid, key in self._where.items() if namespace is None or key[0] == namespace}


def namespace_matches(namespace: str, pattern: str) -> bool:
    """kopf's namespace pattern (its ``match_namespace``): comma-separated globs; a first glob
    that excludes (``!glob``) implies ``*`` before it; an exclusion un-matches, a later inclusive
    glob re-matches only what the first glob matched."""
    globs = [glob.strip() for glob in pattern.split(",")]
    if not globs or globs[0].startswith("!"):
        globs.insert(0, "*")
    matches = first_match = fnmatch.fnmatchcase(namespace, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            matches = matches and not fnmatch.fnmatchcase(namespace, glob.lstrip("!"))
        else:
            matches = matches or (first_match and fnmatch.fnmatchcase(namespace, glob))
    return matches


def is_pattern(namespace: str) -> bool:
    return any(c in namespace for c in "*?[!,")


def watch_scope(namespaces: Sequence[str]) -> tuple[list[Optional[str]], Callable[[str], bool]]:
    """The namespaces to watch (None: all) and which of their pods count. Exact names are each
    watched on their own (a namespaced Role is enough); a pattern needs the cluster-wide watch."""
    if not namespaces:
        return [None], lambda namespace: True
    if any(is_pattern(n) for n in namespaces):
        patterns = list(namespaces)
        return [None], lambda namespace: any(namespace_matches(namespace, p) for p in patterns)
    return list(dict.fromkeys(namespaces)), lambda namespace: True


def _entry(pod: Mapping[str, Any]) -> tuple[JobKey, str, Optional[PodView]]:
    meta = pod.get("metadata") or {}
    job = str((meta.get("labels") or {}).get(names.LABEL_JOB_NAME) or "")
    return (str(meta.get("namespace") or ""), job), str(meta.get("uid") or ""), view_pod(pod)


class PodWatch:
    """Lists and watches the job-labelled pods of ``namespaces`` (empty: all) into ``index``;
    ``on_change`` is called on the event loop for every pod whose view changed or went."""

    def __init__(self, source: PodSource, namespaces: Sequence[str], index: PodIndex, on_change: OnChange, *,
                 selector: str = names.LABEL_JOB_NAME, server_timeout: int = SERVER_TIMEOUT_SECONDS,
                 backoff: Sequence[float] = BACKOFF_SECONDS):
        self.source, self.index, self.on_change = source, index, on_change
        self.scopes, self.accept = watch_scope(namespaces)
        self.selector, self.server_timeout, self.backoff = selector, server_timeout, tuple(backoff)
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._listed: set[Optional[str]] = set()
        self._ready: Optional[asyncio.Event] = None
        self._stop = threading.Event()
        # One scope lists at a time: the raw pods held at once are one page, not one per scope.
        self._listing = threading.Lock()

    # --- on the event loop -----------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        for scope in self.scopes:
            thread = threading.Thread(target=self._run, args=(scope,), daemon=True,
                                      name=f"ddpjob-pod-watch-{scope or 'all'}")
            thread.start()

    async def wait_ready(self) -> None:
        """Returns once every watched namespace's first list is in the index."""
        if self._ready is None:
            raise RuntimeError("the pod watch was not started")
        await self._ready.wait()

    def stop(self) -> None:
        self._stop.set()

    def _apply(self, scope: Optional[str], changes: list[tuple[JobKey, str, Optional[PodView]]],
               listed: bool) -> None:
        """Changes from a watch, or (``listed``) a whole list of the scope: what it lacks is gone."""
        if listed:
            present = {uid for _, uid, _ in changes}
            changes = changes + [(key, uid, None) for uid, key in self.index.uids(scope).items()
                                 if uid not in present]
        for key, uid, view in changes:
            if not uid:
                continue
            self.index.put(key, uid, view)
            self.on_change(key, uid, view)
        if listed and scope not in self._listed:
            self._listed.add(scope)
            if self._ready is not None and len(self._listed) == len(self.scopes):
                self._ready.set()

    # --- in the scope's thread -------------------------------------------------------------------
    def _hand_over(self, scope: Optional[str], changes: list, listed: bool) -> None:
        assert self.loop is not None
        if not self.loop.is_closed():  # the operator is exiting: nobody reads the index any more
            self.loop.call_soon_threadsafe(self._apply, scope, changes, listed)

    def _changes(self, pods: Iterable[Mapping[str, Any]], deleted: bool = False) -> list:
        """The views of ``pods``, taken one at a time (a list comes page by page: only the views
        are kept)."""
        found = []
        for pod in pods:
            if not isinstance(pod, Mapping) or not self.accept(str((pod.get("metadata") or {}).get("namespace") or "")):
                continue
            key, uid, view = _entry(pod)
            found.append((key, uid, None if deleted else view))
        return found

    def _run(self, scope: Optional[str]) -> None:
        version = ""  # "": list first
        failures = 0
        where = scope or "all namespaces"
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._list(scope)
                    if failures:
                        logger.info("pod watch (%s): listing again after %d failure(s)", where, failures)
                    failures = 0
                started = time.monotonic()
                version = self._follow(scope, version)
                failures = 0  # the API server ended the watch: resume (at once, unless it ended at once)
                if time.monotonic() - started < QUICK_END_SECONDS:
                    self._stop.wait(self.backoff[0])
            except Expired:
                version = ""
            except ApiError as exc:
                if exc.status == 410:  # the watch request itself refused as too old: list again
                    version = ""
                    continue
                failures = self._failed(where, exc, failures)
            except Exception as exc:  # the API server unreachable, a bad line: said, and tried again
                failures = self._failed(where, exc, failures)

    def _list(self, scope: Optional[str]) -> str:
        """One list of the scope into the index; the version to watch from. The pods are viewed
        as the pages come (``Kube.list_pods``): what is held of them is their views, and of raw
        pods one page at most (one scope lists at a time)."""
        with self._listing:
            pods, version = self.source.list_pods(scope, self.selector)
            changes = self._changes(pods)
        self._hand_over(scope, changes, listed=True)
        return version or "0"  # (the API server always gives one; "0": any version)

    def _failed(self, where: str, exc: Exception, failures: int) -> int:
        """Log a failure (the first, the tenth, then every hundredth), wait out its backoff."""
        delay = self.backoff[min(failures, len(self.backoff) - 1)]
        failures += 1
        log = logger.warning if failures in (1, 10) or failures % 100 == 0 else logger.debug
        log("pod watch (%s): %s; again in %.0fs (failure %d)", where, exc, delay, failures)
        self._stop.wait(delay)
        return failures

    def _follow(self, scope: Optional[str], version: str) -> str:
        """One watch from ``version`` until the API server ends it; the version to resume from."""
        for event in self.source.watch_pods(scope, self.selector, version, server_timeout=self.server_timeout,
                                            stopped=self._stop.is_set):
            version = self._event(scope, event, version)
            event = None  # the raw pod is not held while the watch waits for the next event
        return version

    def _event(self, scope: Optional[str], event: Any, version: str) -> str:
        """One watch event into the index; the version to resume from."""
        kind = event.get("type") if isinstance(event, Mapping) else None
        obj = event.get("object") if isinstance(event, Mapping) else None
        if not isinstance(obj, Mapping):
            return version
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired()
            raise RuntimeError(f"watch error {obj.get('code')}: {str(obj.get('message') or '')[:200]}")
        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            changes = self._changes([obj], deleted=kind == "DELETED")
            if changes:
                self._hand_over(scope, changes, listed=False)
        return version
