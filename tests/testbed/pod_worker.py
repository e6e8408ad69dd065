"""One pod on a test node: its network, volumes and process, from start to deletion.

Like a kubelet with a container runtime: SIGTERM goes to the container's main process only
(torchrun, say, which forwards it to its workers); when the grace period ends, or when the
main process exits, everything left in the pod's network namespace is SIGKILLed, as a
runtime kills the container's cgroup.
"""
from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import pod_image, pod_status
from .pod_init import mount_pod_shm, unmount
from .pod_probes import ContainerProbes, Target
from .pod_restart import RESTART_ALL, CrashLoopBackOff, restart_action
from .pod_env import ConfigError, Fetch, NotReadyYet, container_argv, container_environment
from .pod_network import Bridge, PodNetwork, hosts_file, kill_netns_processes, resolv_conf
from .pod_volumes import (
    MountpointRegistry, container_mounts, memory_volumes_of, working_directory,
)
from .rest import ApiError, RestClient

log = logging.getLogger(__name__)

POD_INIT = Path(__file__).with_name("pod_init.py")
SHM_SIZE = "64m"  # what Docker and containerd give a pod's /dev/shm
TMP_SIZE = "1g"  # a bound on the tmpfs standing in for the image layer's /tmp (pod_init.py)


@dataclass
class AgentContext:
    """What every pod worker shares."""

    client: RestClient
    bridge: Bridge
    pods_dir: Path
    registry: MountpointRegistry
    fetch: Fetch
    base_env: dict[str, str]
    image_paths: list[str]  # the image's files under the host's /tmp (pod_image.py)


#: Between the exit of a container with its own restartPolicy and the pod's final phase.
FINAL_PHASE_DELAY_SECONDS = 0.5


class PodWorker(threading.Thread):
    def __init__(self, context: AgentContext, pod: dict):
        metadata = pod["metadata"]
        super().__init__(name=f"pod {metadata['namespace']}/{metadata['name']}", daemon=True)
        self.context = context
        self.pod = pod
        self.namespace = metadata["namespace"]
        self.pod_name = metadata["name"]
        self.label = f"{self.namespace}/{self.pod_name}"
        self.uid = metadata["uid"]
        self.container = pod["spec"]["containers"][0]
        self.status_path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}/status"
        self.pod_dir = context.pods_dir / self.namespace / self.pod_name / self.uid
        self.log_path = self.pod_dir / "container.log"
        self.shm_dir = self.pod_dir / "shm"  # the pod sandbox's /dev/shm, while it is mounted
        self._shm_mounted = False
        self.host_ip = context.bridge.gateway
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._network: PodNetwork | None = None
        self._terminating = threading.Event()
        self._gone = False  # deleted from the API: no more status, no delete call
        self._kill_timer: threading.Timer | None = None
        # Status patches go out one at a time, in order; a probe's result is dropped once
        # the run it belongs to ended (its container ID is no longer the running one).
        self._patch_lock = threading.RLock()
        self._running: dict | None = None  # the running container's status fields
        self._restart_all_possible = any(
            rule.get("action") == RESTART_ALL
            for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
            for rule in c.get("restartPolicyRules") or [])
        self.done = threading.Event()

    # -- requests from the agent's pod watch -----------------------------------------------
    def terminate(self, grace_seconds: int) -> None:
        """deletionTimestamp appeared: SIGTERM now, SIGKILL after the grace period."""
        with self._lock:
            if self._terminating.is_set():
                return
            self._terminating.set()
            finished = self.done.is_set()  # ended on its own already: only the delete is left
            process = self._process
            if process is not None and process.poll() is None:
                log.info("%s: SIGTERM, grace %ss", self.label, grace_seconds)
                process.send_signal(signal.SIGTERM)
                self._kill_timer = threading.Timer(grace_seconds, self._kill_everything)
                self._kill_timer.daemon = True
                self._kill_timer.start()
        if finished and not self._gone:
            self._delete_from_api()

    def refresh(self, pod: dict) -> None:
        """A watch event of the pod: its labels and annotations as they are now, for the
        downward API of the container's next start (a kubelet resolves a ``fieldRef`` env from
        its current copy of the pod at each start; the spec cannot change)."""
        with self._lock:
            metadata = {**self.pod["metadata"], "labels": pod["metadata"].get("labels") or {},
                        "annotations": pod["metadata"].get("annotations") or {}}
            self.pod = {**self.pod, "metadata": metadata}

    def vanished(self) -> None:
        """The pod is gone from the API (force-deleted): kill at once."""
        self._gone = True
        self.terminate(0)
        self._kill_everything()

    # -- the pod's life -------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # noqa: BLE001
            # A bug or a host problem (say, no network namespace): fail the pod, saying why,
            # rather than leave a test waiting on a pod that stays Pending.
            log.exception("%s: worker failed", self.label)
            self._fail_to_start(f"test node agent error: {error!r}")
        finally:
            self._cleanup()
            with self._lock:
                self.done.set()
                deleting = self._terminating.is_set()
            if deleting and not self._gone:
                self._delete_from_api()

    def _run(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        if self.pod["spec"].get("initContainers"):
            self._fail_to_start("initContainers are not supported by the test node agent")
            return
        restarts = 0
        last_state = None
        backoff = CrashLoopBackOff()
        while not self._terminating.is_set():
            state = self._run_container_once(restarts, last_state)
            if state is None:  # terminated before it started
                return
            finished = time.monotonic()
            exit_code = state["terminated"]["exitCode"]
            action = restart_action(self.container, self.pod["spec"], exit_code)
            final = action is None or self._terminating.is_set()
            patch = pod_status.terminated_patch(self.container, state, restarts=restarts,
                                                final=final, last_state=last_state)
            if final:
                if self.container.get("restartPolicy") is not None:
                    # As the v1.36 kubelet does (seen on kind): the exit of a container with a
                    # restartPolicy of its own shows first with the pod still Running, the
                    # phase in a later status update.
                    self._patch(pod_status.terminated_patch(self.container, state, restarts=restarts,
                                                            final=False, last_state=last_state))
                    self._terminating.wait(FINAL_PHASE_DELAY_SECONDS)
                self._patch(self._with_restart_all_condition(
                    patch, False, "PodCompleted" if exit_code == 0 else "PodFailed"))
                return
            if action == RESTART_ALL:
                # The kubelet marks the pod, removes its containers and starts them again at
                # once (no exited container is left to back off from).
                self._patch(self._with_restart_all_condition(
                    patch, True, pod_status.RESTART_ALL_STARTED))
                restarts += 1
                removed = pod_status.restarting_all_patch(self.container, restarts=restarts)
                self._patch(self._with_restart_all_condition(removed, False))
                last_state = removed["status"]["containerStatuses"][0]["lastState"]
                log.info("%s: exit %s: restarting all containers", self.label, exit_code)
                continue
            self._patch(patch)
            delay = backoff.delay(finished)
            if delay:
                self._patch(pod_status.crash_loop_patch(
                    self.container, last_state=state, restarts=restarts, delay=delay,
                    pod_label=f"{self.pod_name}_{self.namespace}({self.uid})"))
            log.info("%s: exit %s: restart in %.0fs", self.label, exit_code, delay)
            restarts += 1
            last_state = state
            self._terminating.wait(delay)

    def _with_restart_all_condition(self, patch: dict, restarting: bool,
                                    reason: str | None = None) -> dict:
        """Add AllContainersRestarting where the kubelet reports it: pods with a
        RestartAllContainers rule."""
        if self._restart_all_possible:
            patch["status"].setdefault("conditions", []).append(
                pod_status.all_containers_restarting(restarting, reason))
        return patch

    def _run_container_once(self, restarts: int, last_state: dict | None) -> dict | None:
        if self._network is None:
            self._network = self._create_network()
        spec = self._wait_for_container_spec(self._network.ip)
        if spec is None:
            return None
        start_error_file = self.pod_dir / "start-error"
        start_error_file.unlink(missing_ok=True)
        spec["start_error_file"] = str(start_error_file)
        spec_path = self.pod_dir / "container.json"
        spec_path.write_text(json.dumps(spec))
        argv = ["ip", "netns", "exec", self._network.netns,
                sys.executable, "-I", "-S", str(POD_INIT), str(spec_path)]
        with self._lock:
            if self._terminating.is_set():
                return None
            with open(self.log_path, "ab") as log_file:
                # A file, not a pipe: a chatty process can never block on a full pipe.
                self._process = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                    start_new_session=True, close_fds=True,
                )
        started_at = pod_status.now()
        container_id = f"testbed://{self.uid}/{restarts}"
        log.info("%s: started pid %s at %s", self.label, self._process.pid,
                 self._network.ip)
        process = self._process
        probes = ContainerProbes(
            Target(self.container, self._network.ip, process.pid, spec["env"]),
            started_at=time.monotonic(),
            on_change=lambda started, ready: self._probe_changed(container_id, started, ready),
            on_unhealthy=lambda kind, message: self._unhealthy(process, kind, message),
            label=self.label)
        running = {"started_at": started_at, "restarts": restarts,
                   "container_id": container_id, "last_state": last_state}
        with self._patch_lock:
            self._running = running
            self._patch(self._with_restart_all_condition(pod_status.running_patch(
                self.container, pod_ip=self._network.ip, host_ip=self.host_ip,
                ready=probes.ready, started=probes.started, **running), False))
        probes.start(launching=[argv, argv[4:]])
        returncode = process.wait()
        probes.stop()
        with self._patch_lock:
            self._running = None
        # The main process is gone: nothing else of the container may outlive it.
        kill_netns_processes(self._network.netns)
        with self._lock:
            if self._kill_timer is not None:
                self._kill_timer.cancel()
        exit_code = 128 - returncode if returncode < 0 else returncode
        if start_error_file.exists():
            reason, message = "StartError", start_error_file.read_text()
        else:
            reason = pod_status.exit_reason(exit_code)
            message = pod_status.termination_message(
                (self.pod_dir / "termination-log").read_bytes(),
                _tail(self.log_path, 8192),
                exit_code=exit_code,
                policy=self.container.get("terminationMessagePolicy", "File"),
            )
        log.info("%s: exited %s (%s)", self.label, exit_code, reason)
        return pod_status.terminated_state(exit_code, reason, message, started_at,
                                           pod_status.now(), container_id)

    def _probe_changed(self, container_id: str, started: bool, ready: bool) -> None:
        with self._patch_lock:
            running = self._running
            if running is None or running["container_id"] != container_id:
                return  # that run ended; its exit is what the status says now
            self._patch(pod_status.readiness_patch(self.container, ready=ready,
                                                   started=started, **running))

    def _unhealthy(self, process: subprocess.Popen, kind: str, message: str) -> None:
        """A liveness or startup probe failed for good: the kubelet kills the container
        (SIGTERM, SIGKILL after the grace period) and the restart policy decides the rest.
        Not while the pod is being deleted: the kubelet then counts liveness as a success."""
        if self._terminating.is_set():
            return
        grace = self.container.get(f"{kind}Probe", {}).get("terminationGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        log.info("%s: %s probe failed, killing the container (grace %ss): %s", self.label,
                 kind, grace, message[:200])
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            timer = threading.Timer(grace, self._kill_run, args=(process,))
            timer.daemon = True
            timer.start()

    def _kill_run(self, process: subprocess.Popen) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)

    def _create_network(self) -> PodNetwork:
        spec = self.pod["spec"]
        hostname = (spec.get("hostname") or self.pod_name)[:63]
        return self.context.bridge.create_pod_network(
            netns=self.context.bridge.netns_name(self.uid[:23]),
            hosts=hosts_file(hostname, spec.get("subdomain"), self.namespace),
            resolv_conf=resolv_conf(self.context.bridge.gateway, self.namespace),
        )

    def _wait_for_container_spec(self, pod_ip: str) -> dict | None:
        """Resolve env, argv and volumes; while a referenced object is missing, report
        ContainerCreating and retry, as a kubelet does."""
        if pod_image.unpullable(self.container.get("image") or ""):
            self._never_pulled()
            return None
        reported = False
        while not self._terminating.is_set():
            try:
                return self._container_spec(pod_ip)
            except NotReadyYet as error:
                if not reported:
                    log.info("%s: waiting: %s", self.label, error)
                    self._patch(pod_status.waiting_patch(
                        self.container, self.host_ip, "ContainerCreating", str(error)))
                    reported = True
                self._terminating.wait(1)
            except ConfigError as error:
                self._fail_to_start(str(error))
                return None
        return None

    def _never_pulled(self) -> None:
        """An image no registry serves: ErrImagePull, then ImagePullBackOff until the pod is
        deleted, in the kubelet's words (images.go), the pod Pending."""
        image = self.container.get("image") or ""
        registry = image.split("/", 1)[0]
        self._patch(pod_status.waiting_patch(
            self.container, self.host_ip, "ErrImagePull",
            f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": '
            f'failed to do request: Head "https://{registry}/v2/": dial tcp: lookup {registry}: no such host'))
        if self._terminating.wait(2):
            return
        self._patch(pod_status.waiting_patch(
            self.container, self.host_ip, "ImagePullBackOff", f'Back-off pulling image "{image}"'))
        self._terminating.wait()

    def _container_spec(self, pod_ip: str) -> dict:
        env = container_environment(
            self.pod, self.container, pod_ip=pod_ip, host_ip=self.host_ip,
            base={**self.context.base_env,
                  "HOSTNAME": (self.pod["spec"].get("hostname") or self.pod_name)[:63]},
            fetch=self.context.fetch,
        )
        mounts, _ = container_mounts(self.pod, self.container, self.pod_dir,
                                     self.context.fetch, pod_ip, self.host_ip,
                                     self.context.registry)
        shm_is_a_volume = any(m["target"].rstrip("/") == "/dev/shm" or
                              m["target"].startswith("/dev/shm/") for m in mounts)
        tmp_is_a_volume = any(m["target"].rstrip("/") == "/tmp" for m in mounts)
        return {
            "hostname": env["HOSTNAME"],
            "mounts": mounts,
            "tmp_size": None if tmp_is_a_volume else TMP_SIZE,
            "image_paths": [] if tmp_is_a_volume else self.context.image_paths,
            "pod_shm": None if shm_is_a_volume else self._pod_shm(),
            "workdir": working_directory(self.container, self.pod_dir / "workdir",
                                         self.context.registry),
            "workdir_is_the_agents": not self.container.get("workingDir"),
            "argv": container_argv(self.container, env),
            "env": env,
        }

    def _pod_shm(self) -> str:
        """Mounted at the pod's first container start, kept through its restarts."""
        with self._lock:
            if not self._shm_mounted:
                mount_pod_shm(str(self.shm_dir), SHM_SIZE)
                self._shm_mounted = True
        return str(self.shm_dir)

    def _fail_to_start(self, message: str) -> None:
        log.warning("%s: cannot start: %s", self.label, message)
        self._patch(pod_status.failed_to_start_patch(self.container, self.host_ip, message))

    # -- helpers --------------------------------------------------------------------------
    def _kill_everything(self) -> None:
        with self._lock:
            process, network = self._process, self._network
        if process is not None and process.poll() is None:
            try:
                process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        if network is not None:
            kill_netns_processes(network.netns)

    def _patch(self, patch: dict) -> None:
        with self._patch_lock:
            self._send(patch)

    def _send(self, patch: dict) -> None:
        if self._gone:
            return
        try:
            self.context.client.strategic_patch(self.status_path, patch)
        except ApiError as error:
            if error.status == 404:
                self._gone = True
            else:
                log.warning("%s: status patch failed: %s", self.label, error)

    def _delete_from_api(self) -> None:
        """What the kubelet does once the containers are gone: the final, grace-0 delete
        (the UID precondition spares a new pod that reuses the name)."""
        try:
            self.context.client.delete(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}",
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
        except ApiError as error:
            if error.status not in (404, 409):
                log.warning("%s: final delete failed: %s", self.label, error)

    def _cleanup(self) -> None:
        with self._lock:
            if self._kill_timer is not None:
                self._kill_timer.cancel()
            network, self._network = self._network, None
            shm_mounted, self._shm_mounted = self._shm_mounted, False
        if network is not None:
            self.context.bridge.release(network)
        if shm_mounted:
            try:
                unmount(str(self.shm_dir))
            except OSError as error:
                log.warning("%s: %s", self.label, error)
        shutil.rmtree(memory_volumes_of(self.uid), ignore_errors=True)


def _tail(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - size))
            return handle.read()
    except FileNotFoundError:
        return b""


def delete_finished_pod(client: RestClient, pod: dict) -> None:
    """A pod that already ended (or never ran here) needs no shutdown, only the final delete."""
    metadata = pod["metadata"]
    try:
        client.delete(
            f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}",
            body={"gracePeriodSeconds": 0, "preconditions": {"uid": metadata["uid"]}},
        )
    except ApiError as error:
        if error.status not in (404, 409):
            log.warning("final delete of %s failed: %s", metadata["name"], error)

