"""The operator benchmarks' harness: a test bed with the real operator, a watch that stamps
every pod and DDPJob event with its arrival time, job manifests, process CPU and memory, the
API server's audit log, and the results file.

A benchmark script runs standalone (``Bed.local``: its own control plane, node agent and
operator, as the end-to-end tests start them; it waits for the machine-wide test bed lock) or
inside the pytest session (``Bed.from_fixtures``: the session's test bed and operator; that is
how tests/cluster/test_bench_smoke.py runs each one's ``--smoke`` mode).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]

from benchmarks.bench_results import RESULTS_DIR, machine_info, run_and_record, write_results  # noqa: F401
from benchmarks.bench_stats import (
    JobObs, PodObs, gang_times, job_obs, parse_audit, parse_metrics, pod_obs,
)
from tests.testbed.kube import Kubectl
from tests.testbed.node_agent import NodeSpec
from tests.testbed.operator_runner import (
    OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, OperatorProcess, apply_manifests,
    operator_command, operator_environment, service_account_kubeconfig,
)
from tests.testbed.rest import Informer, RestClient
from tests.testbed.testbed import BRIDGE as TESTBED_BRIDGE, LocalTestbed

OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"
API = "ddpjob.dev/v1alpha1"
JOBS_PATH = "/apis/ddpjob.dev/v1alpha1/namespaces/{ns}/ddpjobs"
JOB_LABEL = "ddpjob.dev/job-name"
SLEEP_1 = ["python3", "-c", "import time; time.sleep(1)"]
APISERVER_METRICS = (
    "apiserver_request_duration_seconds_sum", "apiserver_request_duration_seconds_count",
    "apiserver_flowcontrol_request_wait_duration_seconds_sum",
    "apiserver_flowcontrol_request_wait_duration_seconds_count",
    "apiserver_flowcontrol_rejected_requests_total",
    "etcd_request_duration_seconds_sum", "etcd_request_duration_seconds_count",
    "apiserver_admission_step_admission_duration_seconds_sum",
    "apiserver_admission_step_admission_duration_seconds_count",
)


# ---------------------------------------------------------------------------------------------
# Command line and results
# ---------------------------------------------------------------------------------------------
def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="one tiny run of each case (seconds), for CI")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help="where the JSON results go (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=4, help="test nodes of the standalone test bed")
    parser.add_argument("--pods-per-node", type=int, default=200, help="pod capacity of each test node")
    parser.add_argument("--operator-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra operator environment, e.g. DDPJOB_OPERATOR_CREATE_WORKERS=8")
    parser.add_argument("--pods-nice", type=int, default=0, metavar="N",
                        help="run the node agent and its pods at this niceness (e.g. 19; results get a -niceN "
                        "suffix). Where the kernel groups processes by session for scheduling "
                        "(/proc/sys/kernel/sched_autogroup_enabled = 1) it barely helps: each pod runs in a "
                        "session of its own, and niceness does not count across groups; use --pods-cpu-limit")
    parser.add_argument("--pods-cpu-limit", type=float, default=0, metavar="CORES",
                        help="cap the node agent and its pods at this many cores (a cgroup CPU quota, which "
                        "unlike nice also holds the kernel work the pods' setup does in their own context): "
                        "on a real cluster the pods run on other machines (results get a -cpuN suffix)")
    return parser


@contextlib.contextmanager
def cpu_limited(pid: int, cores: float) -> Iterator[None]:
    """Run ``pid`` (and every process it starts from now on) under a CPU quota of ``cores``,
    in a cgroup of the v1 ``cpu`` controller (this machine's) or of cgroup v2; nothing if 0."""
    if not cores:
        yield
        return
    period_us = 100_000
    quota_us = int(cores * period_us)
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    v2_controllers = (v2 / "cgroup.subtree_control").read_text().split() if (v2 / "cgroup.subtree_control").exists() else []
    if (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / f"ddpjob-bench-{pid}"
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(period_us))
        (group / "cpu.cfs_quota_us").write_text(str(quota_us))
        root = v1
    elif "cpu" in v2_controllers:
        group = v2 / f"ddpjob-bench-{pid}"
        group.mkdir()
        (group / "cpu.max").write_text(f"{quota_us} {period_us}")
        root = v2
    else:
        raise SystemExit("--pods-cpu-limit needs the cgroup cpu controller (v1 /sys/fs/cgroup/cpu, or v2 with "
                         "cpu in /sys/fs/cgroup/cgroup.subtree_control)")
    (group / "cgroup.procs").write_text(str(pid))
    try:
        yield
    finally:
        for task in (group / "cgroup.procs").read_text().split():  # whatever is left: back to the root
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(task)
        with contextlib.suppress(OSError):
            group.rmdir()


def bed_setup(bed: "Bed", args: argparse.Namespace) -> dict[str, Any]:
    """The test-bed settings a benchmark ran with, for its results' params (none of them when
    it ran in the pytest session's test bed, which it does not set up)."""
    if not bed.owns_operator:
        return {"pods_nice": 0, "pods_cpu_limit": 0, "operator_env": {}}
    return {"pods_nice": args.pods_nice, "pods_cpu_limit": args.pods_cpu_limit,
            "operator_env": env_pairs(args.operator_env)}


def bed_setup_text(params: dict[str, Any]) -> str:
    """``params``' test-bed settings in words, "" for the defaults."""
    parts = []
    if params.get("pods_nice"):
        parts.append(f"node agent and pods at nice {params['pods_nice']}")
    if params.get("pods_cpu_limit"):
        parts.append(f"node agent and pods capped at {params['pods_cpu_limit']:g} core(s)")
    parts += [f"{k}={v}" for k, v in (params.get("operator_env") or {}).items()]
    return ", ".join(parts)


def env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--operator-env wants NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------
_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of the process (its threads included), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # fields 14 and 15 of stat(5)


def proc_children_cpu_seconds(pid: int) -> float:
    """cutime + cstime: the CPU of the process's children that it has waited for (the node
    agent's pods and the `ip` commands that plumb their network, once they have exited)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / _TICKS  # fields 16 and 17 of stat(5)


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICKS


def proc_memory_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (the peak resident set since the process started), MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return {"rss_mib": values.get("VmRSS", 0.0), "peak_mib": values.get("VmHWM", 0.0)}


# ---------------------------------------------------------------------------------------------
# The test bed and the operator
# ---------------------------------------------------------------------------------------------
class Bed:
    """What a benchmark needs: admin clients, the operator process, the component pids, the
    audit log."""

    def __init__(self, testbed: LocalTestbed, kubectl: Kubectl, operator: OperatorProcess, *,
                 owns_operator: bool):
        self.testbed = testbed
        self.kubectl = kubectl
        self.rest = RestClient.from_kubeconfig(testbed.control_plane.kubeconfig)
        self.operator = operator
        self.owns_operator = owns_operator
        self.audit_log: Path = getattr(testbed.control_plane, "audit_log", None) or \
            testbed.run_dir / "logs" / "audit.log"

    # -- construction -------------------------------------------------------------------------
    @classmethod
    @contextlib.contextmanager
    def local(cls, args: argparse.Namespace) -> Iterator["Bed"]:
        """A fresh test bed (``args.nodes`` nodes of ``args.pods_per_node`` pods) and operator,
        stopped on the way out."""
        specs = [NodeSpec(f"bench-{i}", cpu="64", memory="256Gi", pods=args.pods_per_node)
                 for i in range(args.nodes)]
        testbed = LocalTestbed()
        try:
            print(f"starting the test bed ({args.nodes} nodes) ...", file=sys.stderr, flush=True)
            testbed.start(specs)
            kubectl = Kubectl(testbed.control_plane.kubeconfig)
            documents = apply_manifests(kubectl, include_workloads=False)
            control_plane = testbed.control_plane
            kubeconfig = service_account_kubeconfig(
                kubectl, control_plane.server, control_plane.pki.ca_cert,
                testbed.run_dir / "operator.kubeconfig")
            operator = OperatorProcess(
                operator_command(documents), kubeconfig, testbed.run_dir / "logs" / "operator.log",
                extra_pythonpath=str(REPO / "tests"),
                env={**operator_environment(documents), **env_pairs(args.operator_env)},
                register=testbed.extra_processes.append)
            operator.start()
            print(f"test bed up: {testbed.run_dir}", file=sys.stderr, flush=True)
            bed = cls(testbed, kubectl, operator, owns_operator=True)
            if args.pods_nice:
                bed.renice_node_agent(args.pods_nice)
            with cpu_limited(testbed.agent.pid, args.pods_cpu_limit):
                yield bed
        finally:
            testbed.stop()

    @classmethod
    def from_fixtures(cls, cluster: Any, operator: OperatorProcess) -> "Bed":
        """The pytest session's test bed and operator (the `cluster` and `operator` fixtures)."""
        return cls(cluster.testbed, cluster.kubectl, operator, owns_operator=False)

    # -- the operator -------------------------------------------------------------------------
    @property
    def operator_pid(self) -> int:
        return self.operator.process.pid

    @contextlib.contextmanager
    def profiled(self, output: Optional[Path]) -> Iterator[None]:
        """py-spy samples the operator while the block runs (``output``: its collapsed stacks;
        None: no profiling), only the thread that holds the GIL (``--gil``): the samples are then
        the Python code that costs CPU, not threads waiting for a socket, a queue or the GIL.
        py-spy is a PyPI tool, not a dependency: `pip install py-spy`."""
        if output is None:
            yield
            return
        output.parent.mkdir(parents=True, exist_ok=True)
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(self.operator_pid), "--rate", "100",
                                "--format", "raw", "--output", str(output), "--nonblocking", "--gil"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # attached before the measured work starts
        try:
            yield
        finally:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)

    def second_operator(self, identity: str) -> OperatorProcess:
        """Another replica of the operator (its own identity in the leader Lease, the same
        command, environment and ServiceAccount as the first), started; the caller stops it."""
        control_plane = self.testbed.control_plane
        kubeconfig = service_account_kubeconfig(
            self.kubectl, control_plane.server, control_plane.pki.ca_cert,
            self.testbed.run_dir / f"{identity}.kubeconfig")
        env = {k: v for k, v in self.operator.extra_env.items() if k != "DDPJOB_OPERATOR_POD_NAME"}
        replica = OperatorProcess(
            self.operator.command_template, kubeconfig, self.testbed.run_dir / "logs" / f"{identity}.log",
            extra_pythonpath=self.operator.extra_pythonpath, env=env, identity=identity,
            register=self.testbed.extra_processes.append)
        return replica.start()

    def restart_operator(self) -> bool:
        """A fresh operator process (so its peak memory is this scenario's); only a bed that
        started its own operator does this. Returns whether it restarted."""
        if not self.owns_operator:
            return False
        self.operator.stop()
        self.operator.start()
        return True

    def renice_node_agent(self, niceness: int) -> None:
        """Lower the CPU priority of the node agent and so of every pod it starts from now on
        (niceness is per thread on Linux and inherited by new threads and processes). With
        autogroup scheduling the pods, each in its own session, still get a full share each:
        see --pods-cpu-limit (cpu_limited) for a cap that holds."""
        for task in Path(f"/proc/{self.testbed.agent.pid}/task").iterdir():
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
            except ProcessLookupError:
                pass

    def component_pids(self) -> dict[str, int]:
        pids = {p.name: p.pid for p in self.testbed.control_plane.processes}
        pids["node-agent"] = self.testbed.agent.pid
        pids["operator"] = self.operator_pid
        return pids

    def cpu_snapshot(self) -> dict[str, float]:
        """CPU seconds used so far by each component (the node agent without its pods), by
        the pods and their setup commands that have exited, by this benchmark process (its
        watch) and, as ``machine``, by every process on all cores (so what else ran, the pods
        still running included, is the difference)."""
        snapshot = {"machine": machine_busy_seconds()}
        for name, pid in {**self.component_pids(), "benchmark": os.getpid()}.items():
            try:
                snapshot[name] = proc_cpu_seconds(pid)
            except OSError:
                pass
        try:
            snapshot["pods (exited; node-agent children)"] = proc_children_cpu_seconds(self.testbed.agent.pid)
        except OSError:
            pass
        return snapshot

    @staticmethod
    def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: round(after[k] - before[k], 2) for k in after if k in before and after[k] >= before[k]}

    # -- the API server's metrics ---------------------------------------------------------
    def metrics(self, names: Sequence[str] = APISERVER_METRICS) -> dict:
        status, body = self.testbed.control_plane.get("/metrics")
        if status != 200:
            raise RuntimeError(f"GET /metrics -> {status}")
        return parse_metrics(body.decode(errors="replace"), names)

    # -- the audit log ------------------------------------------------------------------------
    def audit_offset(self) -> int:
        try:
            return self.audit_log.stat().st_size
        except FileNotFoundError:
            return 0

    def audit_records(self, offset: int, namespace: Optional[str] = None, settle: float = 1.0,
                      username: Optional[str] = OPERATOR_USER):
        """The requests ``username`` (the operator; every user's when None) completed, logged
        after ``offset``, in ``namespace`` only if given; ``settle`` seconds first, for the
        last requests to be written. None without an audit log."""
        time.sleep(settle)
        if not self.audit_log.exists():
            return None
        with open(self.audit_log, "rb") as handle:
            handle.seek(offset)
            lines = handle.read().decode(errors="replace").splitlines()
        records = parse_audit(lines, username)
        if namespace is not None:
            records = [r for r in records if r.namespace == namespace]
        return records

    # -- namespaces, jobs ---------------------------------------------------------------------
    @contextlib.contextmanager
    def namespace(self, prefix: str) -> Iterator[str]:
        name = f"{prefix}-{secrets.token_hex(3)}"
        self.kubectl("create", "namespace", name)
        deadline = time.monotonic() + 60
        while self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no default ServiceAccount in {name}")
            time.sleep(0.2)
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")

    def apply(self, manifests: Sequence[dict]) -> float:
        """``kubectl apply -f -`` of the manifests; returns how long kubectl took."""
        started = time.time()
        self.kubectl.apply_yaml(list(manifests))
        return time.time() - started

    def create_at_once(self, jobs: Sequence[dict], workers: int = 16) -> float:
        """POST the DDPJobs from ``workers`` threads, as many users applying at the same time
        would (one `kubectl apply` of many objects creates them one by one: ~0.5 s each on
        this loaded machine, which would make the benchmark measure kubectl). Returns how long
        creating all of them took."""
        started = time.time()

        def create(job: dict) -> None:
            ns = job["metadata"]["namespace"]
            self.rest.create(JOBS_PATH.format(ns=ns), job)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(create, jobs))
        return time.time() - started

    def pod_pids(self, uid: str) -> list[int]:
        """The processes in a pod's network namespace (the node agent names it after the uid)."""
        result = subprocess.run(["ip", "netns", "pids", f"ddpjob-{TESTBED_BRIDGE}-{uid[:23]}"],
                                capture_output=True, text=True)
        return [int(p) for p in result.stdout.split()]

    def kill_pod_processes(self, uid: str) -> int:
        """SIGKILL everything in the pod, as the OOM killer or a crash would: exit 137."""
        pids = self.pod_pids(uid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)


def ddpjob(name: str, namespace: str, nnodes: int, command: Sequence[str] = SLEEP_1,
           **spec: Any) -> dict:
    """A DDPJob whose pods run ``command`` (the test bed ignores the image)."""
    body = {"nnodes": nnodes, "image": "python:3.11-slim", "command": list(command),
            "shmSize": "64Mi", "startupTimeoutSeconds": 600, **spec}
    return {"apiVersion": API, "kind": "DDPJob", "metadata": {"name": name, "namespace": namespace},
            "spec": body}


# ---------------------------------------------------------------------------------------------
# The watch
# ---------------------------------------------------------------------------------------------
class NamespaceWatch:
    """Watches the pods and jobs of one namespace from this process, stamping each event with
    ``time.time()`` as it arrives. Both watches share this process and clock, so "the pod
    changed" and "the job's status showed it" are compared like for like. Which pods and jobs,
    and what is kept of each event, is the subclass's: ``to_pod`` (None: not a job's pod) and
    ``to_job`` turn an object into an observation with ``uid`` / ``name`` and ``phase``."""

    title = ""  # names the watched system in timeout messages

    def __init__(self, bed: Bed, namespace: str, pod_label: str, jobs_path: str):
        self.namespace = namespace
        self.pods: list[Any] = []
        self.jobs: list[Any] = []
        self.live: dict[str, Any] = {}  # pod uid -> latest, until DELETED
        self.job_state: dict[str, Any] = {}  # job name -> latest, until DELETED
        self.changed = threading.Condition()
        self.stop_event = threading.Event()
        self.informers = [
            Informer(bed.rest, f"/api/v1/namespaces/{namespace}/pods", self._on_pod,
                     label_selector=pod_label, stop=self.stop_event),
            Informer(bed.rest, jobs_path.format(ns=namespace), self._on_job, stop=self.stop_event),
        ]

    def to_pod(self, at: float, event: str, pod: dict) -> Any:
        raise NotImplementedError

    def to_job(self, at: float, event: str, job: dict) -> Any:
        raise NotImplementedError

    def __enter__(self):
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            informer.synced.wait(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()

    def _on_pod(self, event: str, pod: dict) -> None:
        obs = self.to_pod(time.time(), event, pod)
        if obs is None:
            return
        with self.changed:
            self.pods.append(obs)
            if event == "DELETED":
                self.live.pop(obs.uid, None)
            else:
                self.live[obs.uid] = obs
            self.changed.notify_all()

    def _on_job(self, event: str, job: dict) -> None:
        obs = self.to_job(time.time(), event, job)
        with self.changed:
            self.jobs.append(obs)
            if event == "DELETED":
                self.job_state.pop(obs.name, None)
            else:
                self.job_state[obs.name] = obs
            self.changed.notify_all()

    def wait(self, predicate: Callable[[Any], Any], timeout: float, what: str) -> Any:
        """Block until ``predicate(self)`` is truthy (checked on every event); TimeoutError
        naming ``what``, the jobs' phases and the live pods otherwise."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                result = predicate(self)
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    phases = {n: j.phase for n, j in list(self.job_state.items())[:10]}
                    raise TimeoutError(f"{self.title + ': ' if self.title else ''}timed out after {timeout:.0f}s "
                                       f"waiting for {what}; jobs: {phases}, live pods: {len(self.live)}")
                self.changed.wait(min(left, 1.0))

    def clear(self) -> None:
        """Forget the events so far, between repeated runs in one namespace (the live state
        stays)."""
        with self.changed:
            self.pods, self.jobs = [], []


class Recorder(NamespaceWatch):
    """The DDPJob pods and DDPJobs of one namespace."""

    def __init__(self, bed: Bed, namespace: str):
        super().__init__(bed, namespace, JOB_LABEL, JOBS_PATH)

    def to_pod(self, at: float, event: str, pod: dict) -> Optional[PodObs]:
        return pod_obs(at, event, pod)

    def to_job(self, at: float, event: str, job: dict) -> JobObs:
        return job_obs(at, event, job)

    # -- predicates ---------------------------------------------------------------------------
    def phase(self, job: str) -> str:
        state = self.job_state.get(job)
        return state.phase if state else ""

    def finished(self, jobs: Sequence[str]) -> bool:
        return all(self.phase(j) in ("Succeeded", "Failed") for j in jobs)

    def running_pods(self, job: str, attempt: int) -> int:
        return sum(1 for p in self.live.values()
                   if p.job == job and p.attempt == attempt and p.phase == "Running" and not p.deleting)

    def pods_of(self, job: str) -> list[PodObs]:
        return [p for p in self.live.values() if p.job == job]

    def no_pods(self) -> bool:
        return not self.live



def delete_jobs(bed: Bed, rec: Recorder, timeout: float = 180) -> None:
    """Delete every DDPJob of the recorder's namespace, then their pods, and wait until all
    are gone, so the next run starts on a quiet cluster. The pods are deleted here rather than
    left to the garbage collector: for up to 30 s after a CRD is installed the collector has
    not discovered it yet, and takes that long to notice that the pods' owner is gone."""
    bed.kubectl("delete", "ddpjobs", "--all", "-n", rec.namespace, "--wait=false")
    rec.wait(lambda r: not r.job_state, timeout, "the jobs to be gone")
    bed.kubectl("delete", "pods", "-l", JOB_LABEL, "-n", rec.namespace, "--wait=false")
    rec.wait(lambda r: r.no_pods(), timeout, "the jobs' pods to be gone")


def warm_up(bed: Bed, nnodes: int = 1) -> dict[str, float]:
    """One job before the measured ones: the operator's first pass after its start pays for
    one-time work (importing the spec schema, kopf's first events of each watch). Returns that
    cold job's times (seconds from its creation), reported apart."""
    with bed.namespace("bench-warmup") as ns, Recorder(bed, ns) as rec:
        bed.apply([ddpjob("warmup", ns, nnodes)])
        rec.wait(lambda r: r.finished(["warmup"]), 300, "the warm-up job")
        t = gang_times(rec.pods, rec.jobs, "warmup", nnodes)
        delete_jobs(bed, rec)
    return {key: round(t[key] - t["job_added"], 4) for key in ("all_created", "all_running", "job_finished")
            if t[key] is not None}


def settle(max_busy_cores: float = 0.5, quiet_seconds: float = 3.0, timeout: float = 90.0) -> float:
    """Wait until the machine is quiet (under ``max_busy_cores`` busy for ``quiet_seconds`` in
    a row, or ``timeout``), and return how long that took. After a big gang is deleted the
    node agent and the kernel are still tearing down its pods' network namespaces for a while;
    a run started meanwhile measures that teardown too."""
    started = time.monotonic()
    quiet_since = None
    busy = machine_busy_seconds()
    while time.monotonic() - started < timeout:
        time.sleep(0.5)
        now_busy = machine_busy_seconds()
        cores, busy = (now_busy - busy) / 0.5, now_busy
        if cores > max_busy_cores:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_seconds:
            break
    return time.monotonic() - started


def main(name: str, parser: Callable[[], argparse.ArgumentParser],
         run: Callable[[Bed, argparse.Namespace], dict], report: Callable[[dict], str], argv=None) -> None:
    """An operator benchmark's command: its own test bed and operator, its run, its tables
    printed and its results file written."""
    def run_in_own_bed(args: argparse.Namespace) -> dict:
        with Bed.local(args) as bed:
            return run(bed, args)

    run_and_record(name, parser().parse_args(argv), run_in_own_bed, report)
