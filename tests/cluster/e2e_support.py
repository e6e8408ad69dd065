"""Helpers of the end-to-end scenarios (tests/cluster/test_e2e_*.py), on top of the test bed's
fixtures (conftest.py). The same helpers run on both targets; where the local test bed and
kind must differ, the branch is here, in one place, and says why:

* ``kill_training_worker``: locally every pod's processes are host processes, so the worker
  is found by scanning the host's /proc; on kind the same script runs inside the pod with
  ``kubectl exec`` (each container has its own PID namespace there).
* ``checkpoint_steps``, ``open_gate``: the ``shared_host_dir`` fixture is a folder this
  process can read and write on both targets (on kind, scripts/kind/up.sh mounts one host folder
  into every node at the same path, so a ``hostPath`` there is one folder shared by all nodes,
  as a shared volume would be). Only a kind cluster made otherwise (a hostPath inside each node)
  needs the ``kubectl exec`` branch, into a pod that mounts it.
* ``prepare_shared_dir``: kubelet creates a missing ``hostPath`` (DirectoryOrCreate) as root,
  mode 0755, and the trainer image runs as uid 10001, so where the test cannot open the folder
  up itself a short root pod does (locally pods run as root).

Reads go through the API (``cluster.api_client``) as plain dicts; the scenarios use the real
``kubectl`` where the issue says so (``kubectl apply``, ``kubectl get ddpjobs``).
"""
from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import pytest

from ddpjob.api import names
from tests.support.progress_jobs import HANGING_SCRIPT
from tests.testbed import kind as kind_target
from tests.testbed.operator_runner import operator_environment, render_manifests

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
GROUP, VERSION, PLURAL = names.API_GROUP, names.API_VERSION, names.PLURAL
JOB_LABEL = names.LABEL_JOB_NAME
RANK_LABEL = names.LABEL_NODE_RANK
ATTEMPT_LABEL = names.LABEL_RESTART_ATTEMPT
FINISHED = ("Succeeded", "Failed")

# The tiny training the scenarios use: the trainer's small CNN on generated data, one thread
# per rank (this machine has 2 cores), no DataLoader worker processes.
TINY_TRAINING_ARGS = ["--model=tiny-cnn", "--dataset=fake", "--image-size=32",
                      "--num-workers=0", "--cpu-threads=1"]
ONE_THREAD_ENV = [{"name": "OMP_NUM_THREADS", "value": "1"}]


# -- manifests --------------------------------------------------------------------------
def python_command(code: str) -> list[str]:
    """A container command running ``python -c code`` (the host's Python locally, the trainer
    image's on kind)."""
    return ["python", "-u", "-c", textwrap.dedent(code).strip()]


def ddpjob_manifest(name: str, image: str, *, nnodes: int = 2, command: Optional[list] = None,
                    args: Optional[list] = None, **spec: Any) -> dict:
    """A DDPJob. Short grace period and startup timeout unless given: the scenarios should not
    wait on defaults meant for real clusters."""
    body: dict[str, Any] = {"nnodes": nnodes, "image": image, **spec}
    if command is not None:
        body["command"] = command
    if args is not None:
        body["args"] = args
    template = body.setdefault("template", {})
    template.setdefault("spec", {}).setdefault("terminationGracePeriodSeconds", 5)
    body.setdefault("startupTimeoutSeconds", 120)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": names.KIND,
            "metadata": {"name": name}, "spec": body}


def hostpath_volume(name: str, path: str) -> dict:
    return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


# -- the `ddpjob` command, as a user runs it --------------------------------------------------
def kubeconfig_flags(cluster) -> list[str]:
    """The admin's kubeconfig (local test bed) or kube context (kind), as a user passes them."""
    flags = ["--kubeconfig", str(cluster.kubeconfig)] if cluster.kubeconfig else []
    return flags + (["--context", cluster.context] if cluster.context else [])


def ddpjob_cli(cluster, command: str, *argv: str, plugin: bool = False,
               timeout: float = 60) -> subprocess.CompletedProcess:
    """``ddpjob COMMAND ARGV...`` (``plugin``: ``kubectl ddpjob ...``, the kubectl plugin) with
    the cluster's kubeconfig flags."""
    program = ["kubectl", "ddpjob"] if plugin else [sys.executable, "-m", "ddpjob.cli"]
    return subprocess.run([*program, command, *kubeconfig_flags(cluster), *argv], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


# -- logs -------------------------------------------------------------------------------
_TEXT_EVENT = re.compile(r"^ddptrain: (start|progress|done) (.*)$")


def trainer_events(log: str, event: str) -> list[dict[str, str]]:
    """The trainer's ``ddptrain: <event> k=v ...`` lines (progress.py's text format) as dicts;
    ``step=40/100`` becomes step=40, total_steps=100."""
    found = []
    for line in log.splitlines():
        match = _TEXT_EVENT.match(line.strip())
        if not match or match.group(1) != event:
            continue
        fields: dict[str, str] = {}
        for pair in match.group(2).split():
            key, _, value = pair.partition("=")
            if key in ("step", "epoch") and "/" in value:
                value, total = value.split("/", 1)
                fields["total_steps" if key == "step" else "epochs"] = total
            fields[key] = value
        found.append(fields)
    return found


# -- other users (a tenant, a job's owner) ----------------------------------------------------
def user_name(role: str) -> str:
    return f"{role}-{secrets.token_hex(3)}@example.com"


def as_user(kubectl, user: str, *args: str, input: Optional[str] = None):
    """kubectl as that user (the admin impersonates it: the API server authorizes and admits
    the request as the user's own)."""
    return kubectl(f"--as={user}", *args, input=input, check=False)


def grant(kubectl, ns: str, user: str, name: str, rules: list[dict]) -> None:
    """A Role with these rules in ns, bound to user."""
    kubectl.apply_yaml([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": ns}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
    ])


def wait_until_allowed(cluster, user: str, verb: str, resource: str, ns: str) -> None:
    """RBAC bindings reach the API server's authorizer a moment after they are written."""
    cluster.wait_for(lambda: as_user(cluster.kubectl, user, "auth", "can-i", verb, resource,
                                     "-n", ns).stdout.strip() == "yes",
                     30, f"{user} allowed to {verb} {resource} in {ns}", interval=0.5)


# -- the scenario's view of one namespace -------------------------------------------------
@dataclass
class E2E:
    """One test's namespace on the cluster under test: create DDPJobs, read them and their
    children through the API, wait for outcomes."""

    cluster: Any
    namespace: str
    image: str

    def __post_init__(self):
        from kubernetes import client

        self.core = client.CoreV1Api(self.cluster.api_client)
        self.custom = client.CustomObjectsApi(self.cluster.api_client)

    @property
    def local(self) -> bool:
        return self.cluster.testbed is not None

    # DDPJobs
    def create(self, manifest: dict) -> dict:
        return self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, manifest)

    def job(self, name: str) -> Optional[dict]:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def status(self, name: str) -> dict:
        return (self.job(name) or {}).get("status") or {}

    def patch_spec(self, name: str, spec: dict) -> dict:
        return self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec})

    def delete_job(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def wait_for_status(self, name: str, predicate: Callable[[dict], Any], timeout: float,
                        what: str) -> dict:
        """The job's status once ``predicate(status)`` holds. A timeout names the last status."""
        last: dict = {}

        def check():
            nonlocal last
            last = self.status(name)
            return last if predicate(last) else None

        try:
            return self.cluster.wait_for(check, timeout, f"DDPJob {self.namespace}/{name}: {what}")
        except TimeoutError as error:
            raise TimeoutError(f"{error}\nlast status: {json.dumps(last, indent=1)}\n"
                               f"pods: {self.pod_summary(name)}") from None

    def wait_for_phase(self, name: str, phases: Iterable[str] | str, timeout: float = 120) -> dict:
        wanted = (phases,) if isinstance(phases, str) else tuple(phases)
        return self.wait_for_status(name, lambda s: s.get("phase") in wanted, timeout,
                                    f"phase in {wanted}")

    def wait_until_finished(self, name: str, timeout: float = 120) -> dict:
        return self.wait_for_phase(name, FINISHED, timeout)

    # children
    def pods(self, name: str) -> list[dict]:
        response = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{JOB_LABEL}={name}", _preload_content=False)
        return json.loads(response.data)["items"]

    def pod(self, pod_name: str) -> Optional[dict]:
        return self._read_or_none(self.core.read_namespaced_pod, pod_name)

    def service(self, name: str) -> Optional[dict]:
        return self._read_or_none(self.core.read_namespaced_service, name)

    def _read_or_none(self, read: Callable[..., Any], name: str) -> Optional[dict]:
        """The object as JSON, or None when it does not exist (404)."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = read(name, self.namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return json.loads(response.data)

    def pod_summary(self, name: str) -> list[str]:
        try:
            return [f"{p['metadata']['name']} attempt={p['metadata']['labels'].get(ATTEMPT_LABEL)}"
                    f" phase={p.get('status', {}).get('phase')}"
                    f"{' deleting' if p['metadata'].get('deletionTimestamp') else ''}"
                    for p in self.pods(name)]
        except Exception as error:  # noqa: BLE001 - only for a failure message
            return [f"(could not list pods: {error})"]

    def unfinished_pods(self, name: str) -> list[dict]:
        """Pods that still run or hold resources: not Succeeded/Failed."""
        return [p for p in self.pods(name) if p.get("status", {}).get("phase") not in FINISHED]

    def logs(self, pod_name: str) -> str:
        return self.cluster.pod_logs(self.namespace, pod_name)

    def wait_for_logs(self, pod_name: str, needle: str, timeout: float = 30) -> str:
        """A finished pod's log as the test bed has it (the agent's file, or `kubectl logs`),
        once it contains ``needle``."""
        return self.cluster.wait_for(lambda: (lambda text: text if needle in text else None)(
            self.logs(pod_name)), timeout, f"{needle!r} in the log of pod {pod_name}")

    def events(self, name: str) -> list[dict]:
        response = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}",
            _preload_content=False)
        return json.loads(response.data)["items"]

    def wait_for_event(self, name: str, reason: str, timeout: float = 30) -> list[dict]:
        """The Events of that reason on the object (kopf posts them from a queue, so one can
        land a moment after the status that goes with it)."""
        return self.cluster.wait_for(
            lambda: [e for e in self.events(name) if e["reason"] == reason], timeout,
            f"an Event {reason} on {name}")


def scrape(e2e: "E2E") -> dict[str, float]:
    """The operator's /metrics, as {series with labels: value}. On the test bed the operator is a
    host process on the Deployment's port; on kind, through the API server's proxy to the
    metrics Service in manifests/operator.yaml (what a Prometheus in the cluster scrapes)."""
    if e2e.local:
        port = operator_environment(render_manifests())["DDPJOB_OPERATOR_METRICS_PORT"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    else:
        text = e2e.core.connect_get_namespaced_service_proxy_with_path(
            "ddpjob-operator-metrics:metrics", "ddpjob-system", "metrics")
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^(ddpjob_[^ ]+) ([0-9.eE+-]+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


def table_rows(output: str) -> tuple[list[str], list[dict[str, str]]]:
    """`kubectl get` output as (columns, rows), each row cut at the header's column positions
    (a cell may be empty or hold spaces, so splitting on whitespace would shift the cells)."""
    header, *lines = output.splitlines()
    columns = header.split()
    starts = [header.index(column) for column in columns] + [None]
    return columns, [{column: line[a:b].strip() for column, a, b in zip(columns, starts, starts[1:])}
                     for line in lines]


def parse_time(text: str) -> dt.datetime:
    """A Kubernetes timestamp (RFC 3339, ``Z``)."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def seconds_between(earlier: str, later: str) -> float:
    return (parse_time(later) - parse_time(earlier)).total_seconds()


def terminated_state(pod: dict) -> dict:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return statuses[0].get("state", {}).get("terminated") or {}


# -- watching pods for the whole of a scenario -------------------------------------------
@dataclass
class SeenPod:
    uid: str
    name: str
    node_rank: int
    attempt: int
    phases: list[str] = field(default_factory=list)


class PodRecorder:
    """Watches a job's pods from before it is created, and keeps every pod (by uid) ever seen:
    "exactly N pods were created for attempt 0" needs a watch, not a listing at the end."""

    def __init__(self, e2e: E2E, job_name: str):
        self.e2e = e2e
        self.job_name = job_name
        self.pods: dict[str, SeenPod] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name=f"pods of {job_name}", daemon=True)

    def __enter__(self) -> "PodRecorder":
        self._thread.start()
        if not self._synced.wait(30):
            raise TimeoutError(f"the pod watch of {self.job_name} did not start")
        return self

    def __exit__(self, *exc) -> None:
        # No join: the watch notices the flag at its next event or server timeout (5 s), and
        # the scenario has seen the outcome it waited for by now; waiting would only cost time.
        self._stop.set()

    def _record(self, pod: dict) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        with self._lock:
            seen = self.pods.setdefault(meta["uid"], SeenPod(
                meta["uid"], meta["name"], int(labels[RANK_LABEL]), int(labels[ATTEMPT_LABEL])))
            phase = pod.get("status", {}).get("phase")
            if phase and (not seen.phases or seen.phases[-1] != phase):
                seen.phases.append(phase)

    def _run(self) -> None:
        from kubernetes import watch

        selector = f"{JOB_LABEL}={self.job_name}"
        resource_version = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    response = self.e2e.core.list_namespaced_pod(
                        self.e2e.namespace, label_selector=selector, _preload_content=False)
                    listing = json.loads(response.data)
                    for pod in listing["items"]:
                        self._record(pod)
                    resource_version = listing["metadata"]["resourceVersion"]
                    self._synced.set()
                stream = watch.Watch().stream(
                    self.e2e.core.list_namespaced_pod, self.e2e.namespace,
                    label_selector=selector, resource_version=resource_version,
                    timeout_seconds=5, deserialize=False)
                for event in stream:
                    if event["type"] == "ERROR":
                        resource_version = None  # 410 Gone: list again
                        break
                    obj = event["object"]
                    resource_version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._record(obj)
                    if self._stop.is_set():
                        break
            except Exception as error:  # noqa: BLE001 - retry; remembered for the report
                self._error = error
                time.sleep(0.5)

    def snapshot(self) -> list[SeenPod]:
        with self._lock:
            return [SeenPod(p.uid, p.name, p.node_rank, p.attempt, list(p.phases))
                    for p in self.pods.values()]

    def uids(self, attempt: Optional[int] = None) -> dict[int, list[str]]:
        """node rank -> uids of the pods seen for that rank (in ``attempt``, if given)."""
        by_rank: dict[int, list[str]] = {}
        for pod in self.snapshot():
            if attempt is None or pod.attempt == attempt:
                by_rank.setdefault(pod.node_rank, []).append(pod.uid)
        return by_rank

    def pods_per_rank(self, attempt: int) -> dict[int, int]:
        """node rank -> how many pods were ever created for it in ``attempt``."""
        return {rank: len(uids) for rank, uids in self.uids(attempt).items()}

    def attempts(self) -> set[int]:
        return {p.attempt for p in self.snapshot()}

    def describe(self) -> str:
        if self._error is not None:  # the watch had to start over at least once
            return f"(watch error: {self._error!r}) " + self._describe()
        return self._describe()

    def _describe(self) -> str:
        return "; ".join(f"{p.name} attempt={p.attempt} uid={p.uid[:8]} {'>'.join(p.phases)}"
                         for p in sorted(self.snapshot(), key=lambda p: (p.attempt, p.node_rank)))


# -- killing one training process -------------------------------------------------------
# Run with the job's name, namespace and node rank. Finds the training worker processes of that
# node: the pod's environment (DDPJOB_NAME/NAMESPACE, NODE_RANK), plus the variables torchrun
# gives only its workers (TORCHELASTIC_RUN_ID, GROUP_RANK), minus their own children (DataLoader
# workers inherit the environment), and SIGKILLs local rank 0. Prints what it killed, exits 1
# if there was none (yet).
KILL_WORKER_SCRIPT = r"""
import os, signal, sys
job, namespace, node_rank = (a.encode() for a in sys.argv[1:4])

def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)

def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None

workers = {}
for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    env = environ(entry)
    if not env or (env.get(b"DDPJOB_NAME"), env.get(b"DDPJOB_NAMESPACE"),
                   env.get(b"NODE_RANK")) != (job, namespace, node_rank):
        continue
    if b"TORCHELASTIC_RUN_ID" in env and b"GROUP_RANK" in env:
        workers[int(entry)] = env
targets = [pid for pid, env in workers.items()
           if parent(pid) not in workers and env.get(b"LOCAL_RANK") == b"0"]
if not targets:
    print("no training worker found", file=sys.stderr)
    sys.exit(1)
for pid in targets:
    os.kill(pid, signal.SIGKILL)
    print(f"killed pid {pid} (RANK={workers[pid].get(b'RANK', b'?').decode()})")
"""


def kill_training_worker(e2e: E2E, job_name: str, node_rank: int) -> str:
    """SIGKILL the training process (local rank 0) of ``node_rank``; returns what was killed.
    Raises if none runs (callers retry through wait_for)."""
    argv = [job_name, e2e.namespace, str(node_rank)]
    if e2e.local:
        import subprocess
        import sys

        result = subprocess.run([sys.executable, "-c", KILL_WORKER_SCRIPT, *argv],
                                capture_output=True, text=True, timeout=30)
    else:
        pod = names.node_pod_name(job_name, node_rank)
        result = e2e.cluster.kubectl("exec", "-n", e2e.namespace, pod, "-c", names.CONTAINER_NAME, "--",
                                     "python", "-c", KILL_WORKER_SCRIPT, *argv, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"killing the worker of node {node_rank}: {result.stderr.strip()}")
    return result.stdout.strip()


# -- a directory every pod of a job shares ------------------------------------------------
_CHECKPOINT_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_steps(e2e: E2E, host_dir: str, pod_name: str, mount_path: str) -> list[int]:
    """The steps of the complete checkpoints in the shared directory (read here when the test
    sees it, else with ``kubectl exec`` in a pod that mounts it at ``mount_path``)."""
    if Path(host_dir).is_dir():
        files = [p.name for p in Path(host_dir).iterdir()]
    else:
        result = e2e.cluster.kubectl("exec", "-n", e2e.namespace, pod_name, "-c",
                                     names.CONTAINER_NAME, "--", "ls", "-1", mount_path,
                                     check=False)
        if result.returncode != 0:
            return []
        files = result.stdout.split()
    return sorted(int(m.group(1)) for m in map(_CHECKPOINT_NAME.match, files) if m)


def prepare_shared_dir(e2e: E2E, path: str) -> None:
    """Make a hostPath directory writable for the trainer image's non-root user (module doc)."""
    if e2e.local:
        return
    if Path(path).is_dir():
        Path(path).chmod(0o1777)
        return
    name = "prepare-shared-dir"
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 0},
            "containers": [{"name": "main", "image": e2e.image, "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "-c",
                                        "import os; os.chmod('/shared', 0o1777)"],
                            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}],
            "volumes": [hostpath_volume("shared", path)],
        },
    }
    e2e.cluster.kubectl.apply_yaml(pod, "-n", e2e.namespace)
    e2e.cluster.wait_for(
        lambda: (e2e.pod(name) or {}).get("status", {}).get("phase") == "Succeeded",
        120, f"pod {name} to open up {path}")
    e2e.cluster.kubectl("delete", "pod", name, "-n", e2e.namespace, "--wait=false")


def hanging_job(e2e: E2E, shared_host_dir: str, name: str, *, env: Iterable[dict] = (), **fields) -> dict:
    """A 2-node DDPJob of tests/support/progress_jobs.HANGING_SCRIPT (its behaviour set by
    ``env``: HANG, HANG_AT, FAIL_ON_ATTEMPT), handed over, with its checkpoint, through a host
    folder every node mounts at /shared. Skips on kind without that folder."""
    if not e2e.local and kind_target.shared_dir() is None:
        pytest.skip("the script is handed over through a host folder every node mounts "
                    "($DDPJOB_KIND_SHARED_DIR, set by scripts/e2e-kind.sh)")
    prepare_shared_dir(e2e, shared_host_dir)
    Path(shared_host_dir, "hang.py").write_text(textwrap.dedent(HANGING_SCRIPT))
    return ddpjob_manifest(
        name, e2e.image, args=["--script", "/shared/hang.py"],
        env=[*ONE_THREAD_ENV, {"name": "CKPT", "value": "/shared/ckpt"}, *env],
        volumeMounts=[{"name": "shared", "mountPath": "/shared"}],
        template={"spec": {"volumes": [hostpath_volume("shared", shared_host_dir)],
                           "terminationGracePeriodSeconds": 2}},
        **fields)


def gate_command(mount_path: str, timeout_seconds: int = 120) -> list[str]:
    """A pod command that waits until the test opens the gate (a file ``go`` in a shared
    directory), then exits 0; exit 1 if it never opens. Lets a scenario decide when pods finish
    instead of guessing with sleeps."""
    return python_command(f"""
        import os, sys, time
        deadline = time.monotonic() + {timeout_seconds}
        print("waiting for the gate", flush=True)
        while not os.path.exists("{mount_path}/go"):
            if time.monotonic() > deadline:
                sys.exit("the gate never opened")
            time.sleep(0.2)
        print("gate open", flush=True)
    """)


def open_gate(e2e: E2E, host_dir: str, pod_name: str, mount_path: str) -> None:
    """Create ``go`` in the shared directory: directly where the test sees it, else through a
    pod that mounts it (module doc)."""
    if Path(host_dir).is_dir():
        (Path(host_dir) / "go").touch()
        return
    e2e.cluster.kubectl("exec", "-n", e2e.namespace, pod_name, "-c", names.CONTAINER_NAME, "--", "python",
                        "-c", f"open('{mount_path}/go', 'w').close()")


def enforce_restricted(e2e: E2E) -> None:
    """Label the namespace to enforce the "restricted" Pod Security profile, and wait until
    admission sees the label (it reads namespaces from an informer cache)."""
    e2e.cluster.kubectl("label", "namespace", e2e.namespace,
                        "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "psa-probe"},
             "spec": {"containers": [{"name": "c", "image": e2e.image,
                                      "securityContext": {"privileged": True}}]}}

    def refused() -> bool:
        result = e2e.cluster.kubectl("apply", "--dry-run=server", "-n", e2e.namespace, "-f", "-",
                                     input=json.dumps(probe), check=False)
        return result.returncode != 0 and "violates PodSecurity" in result.stderr

    e2e.cluster.wait_for(refused, 30, f"Pod Security 'restricted' enforced in {e2e.namespace}")


# -- fixtures (import them into a test module: ``from .e2e_support import e2e``) ---------
@pytest.fixture
def e2e(cluster, namespace, operator, trainer_image) -> E2E:  # noqa: ARG001 - operator: running
    """The scenario's namespace, with the operator running."""
    return E2E(cluster, namespace, trainer_image)
