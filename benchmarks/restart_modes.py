"""Restart: in place against recreate, on kind. Time from a SIGKILLed rank to the next attempt's
first training step, and where it goes.

    python -m benchmarks.restart_modes               # 10 restarts per mode (kind: make kind-up, or this starts it)
    python -m benchmarks.restart_modes --restarts 3 --modes InPlace

A 2-node DDPJob per mode (failurePolicy.restartMode InPlace, then Recreate), then the same as
a PyTorchJob of Kubeflow's training-operator v1.8.1 (a host process against the kind cluster, as
benchmarks/peer_controllers.py sets it up; Master + Worker with restartPolicy OnFailure, so the
kubelet restarts the failed container in its pod, under its crash-loop back-off; the command is
torchrun on the variables it sets) runs the trainer image's real trainer (tiny-cnn on FakeData, gloo, one thread per rank, a checkpoint every 20
steps on a hostPath folder both kind nodes share, `--log-every 1 --log-format json`). Each round
SIGKILLs node 1's training process (exit 137, retryable), as the OOM killer would, from inside
its pod, and reads node 0's log (rank 0 prints) for the next attempt. The milestones, all on
the host's clock (kind's nodes are containers on this machine):
  - the kill (the killing process's clock);
  - the DDPJob seen Restarting (this process polls it every 0.1 s);
  - the next attempt's rank-0 process started (/proc, from its start line: the start line's
    time less its startup_*_s phases, trainer/ddptrainer/startup.py);
  - its import (interpreter and torch), rendezvous, data set, model and checkpoint load done;
  - its first training step (its first progress line).
`kill -> process started` is the stop of the old attempt (SIGTERM, the healthy ranks'
checkpoint) plus the relaunch: in place the entry point starting new workers in the same pod
(from the second attempt on forked from its warm process, trainer/ddptrainer/warm_start.py, so
the import phase is short); on Recreate the pods deleted, created, scheduled and a new container
started; for the PyTorchJob the surviving rank noticing its lost peer and the kubelet restarting
both containers. A restart that reaches no training step within --cap-seconds (180) is recorded
as such and ends that mode's rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from benchmarks.bench_results import run_and_record
from benchmarks.bench_stats import summarize, table
from ddpjob.api import names
from tests.cluster.e2e_support import (
    E2E, GROUP, KILL_WORKER_SCRIPT, PLURAL, VERSION, ONE_THREAD_ENV, TINY_TRAINING_ARGS, ddpjob_manifest, hostpath_volume,
    prepare_shared_dir,
)
from tests.testbed.kube import Kubectl, api_client_from_kubeconfig
from tests.testbed.processes import wait_for

NAME = "restart_modes"
REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("KIND_CLUSTER_NAME", "ddpjob")
IMAGE = os.environ.get("DDPJOB_TRAINER_IMAGE", "localhost/ddpjob/trainer:0.1.0")
CHECKPOINT_EVERY = 20
PYTORCHJOB = "PyTorchJob"
PEER_VERSION = "v1.8.1"
STEPS = [("kill -> DDPJob Restarting", "restarting_s"),
         ("kill -> next attempt's process started", "process_started_s"),
         ("kill -> torch imported", "imported_s"),
         ("kill -> rendezvous done", "rendezvous_s"),
         ("kill -> data, model, checkpoint loaded", "loaded_s"),
         ("kill -> first training step", "first_step_s")]
PHASES = [("stop and relaunch", "process_started_s", None),
          ("interpreter and torch import", "imported_s", "process_started_s"),
          ("rendezvous", "rendezvous_s", "imported_s"),
          ("data, model, checkpoint load", "loaded_s", "rendezvous_s"),
          ("first step", "first_step_s", "loaded_s")]
# The kill, with the time of it on the pod's clock (the host's, on kind).
KILL_AND_TIME = KILL_WORKER_SCRIPT + "\nimport time\nprint(f'killed at {time.time():.6f}')\n"


@dataclass
class KindCluster:
    """What e2e_support's helpers use of the test suite's Cluster, for a kind context."""

    kubectl: Kubectl
    api_client: Any
    context: str
    testbed: None = None
    kubeconfig: None = None

    def wait_for(self, predicate, timeout: float, message: str, interval: float = 0.2):
        return wait_for(predicate, timeout, message, interval)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--restarts", type=int, default=10, help="restarts per mode")
    p.add_argument("--modes", default=f"InPlace,Recreate,{PYTORCHJOB}",
                   help=f"failurePolicy.restartMode values and {PYTORCHJOB} (training-operator {PEER_VERSION}), in order")
    p.add_argument("--cap-seconds", type=float, default=180.0,
                   help="the longest wait for a restarted job's next training step; a mode's rounds end at the first one past it")
    p.add_argument("--smoke", action="store_true", help="1 restart per mode")
    p.add_argument("--results-dir", default=str(REPO_ROOT / "benchmarks" / "results"))
    return p


def kind_up() -> None:
    """The kind cluster with the operator (scripts/kind/up.sh: cached, an existing one reused)."""
    result = subprocess.run(["bash", "scripts/kind/up.sh"], cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"scripts/kind/up.sh failed:\n{result.stderr[-3000:]}")
    for line in result.stdout.splitlines():
        match = re.fullmatch(r"export (\w+)=(.*)", line.strip())
        if match:
            os.environ[match.group(1)] = match.group(2)


def json_events(log: str) -> list[dict]:
    events = []
    for line in log.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                events.append(event)
    return events


def next_attempt_milestones(events: list[dict], killed_at: float) -> Optional[dict[str, float]]:
    """Absolute times of the first attempt that started after the kill: its process start and
    phases (its start line), its first step; None until its first progress line is logged."""
    start = next((e for e in events if e["event"] == "start" and e.get("time", 0) > killed_at), None)
    if start is None:
        return None
    after = events[events.index(start) + 1:]
    step = next((e for e in after if e["event"] == "progress"), None)
    if step is None:
        return None
    phases = [start.get(f"startup_{p}_s", 0.0) for p in ("import", "rendezvous", "data", "model_and_resume")]
    loaded = start["time"]
    rendezvous = loaded - phases[3] - phases[2]
    imported = rendezvous - phases[1]
    return {"process_started": imported - phases[0], "imported": imported, "rendezvous": rendezvous,
            "loaded": loaded, "first_step": step["time"], "resumed_step": start.get("step")}


class PhaseWatch:
    """Polls the DDPJob every 0.1 s: when it was first seen Restarting after a mark."""

    def __init__(self, e2e: E2E, name: str):
        self.e2e, self.name = e2e, name
        self.seen: list[tuple[float, str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            job = self.e2e.job(self.name) or {}
            status = job.get("status") or {}
            self.seen.append((time.time(), status.get("phase", ""), status.get("restartAttempt", 0)))
            self._stop.wait(0.1)

    def first(self, phase: str, after: float) -> Optional[float]:
        return next((t for t, p, _ in list(self.seen) if t >= after and p == phase), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def pod_events(e2e: E2E, pod: str, container: str = names.CONTAINER_NAME) -> list[dict]:
    return json_events(e2e.cluster.kubectl("logs", "-n", e2e.namespace, pod, "-c", container,
                                           check=False, timeout=60).stdout)


@dataclass
class BenchJob:
    """One job the rounds kill a rank of: where rank 0 logs, which pod is the victim, how it
    restarted (``restart_mode``) and how to remove it."""

    name: str
    node0_pod: str
    victim_pod: str
    container: str
    restart_mode: Any  # () -> str
    delete: Any  # () -> None


def training_args() -> list[str]:
    return [*TINY_TRAINING_ARGS, "--fake-size=1000000", "--batch-size=16", "--epochs=1",
            "--log-every=1", "--log-format=json", "--checkpoint-dir=/checkpoints",
            f"--checkpoint-every={CHECKPOINT_EVERY}"]


def ddpjob(e2e: E2E, mode: str, restarts: int, folder: Path) -> BenchJob:
    name = f"restart-{mode.lower()}"
    manifest = ddpjob_manifest(
        name, IMAGE, env=ONE_THREAD_ENV, args=training_args(),
        volumeMounts=[{"name": "checkpoints", "mountPath": "/checkpoints"}],
        template={"spec": {"volumes": [hostpath_volume("checkpoints", str(folder))],
                           "terminationGracePeriodSeconds": 10}},
        # The same rank is killed every round: node exclusion off, or after two rounds on each
        # node no node is left to schedule on (failurePolicy.excludeNodeAfterFailures).
        failurePolicy={"maxRestarts": restarts + 2, "restartMode": mode, "excludeNodeAfterFailures": 0})
    e2e.create(manifest)

    def restart_mode() -> str:
        history = ((e2e.job(name) or {}).get("status") or {}).get("failureHistory") or [{}]
        return str(history[0].get("restartMode"))

    return BenchJob(name, names.node_pod_name(name, 0), names.node_pod_name(name, 1), names.CONTAINER_NAME,
                    restart_mode, lambda: e2e.delete_job(name))


PYTORCHJOB_CONTAINER = "pytorch"  # the container name PyTorchJob requires


def pytorchjob_manifest(name: str, namespace: str, folder: str, restarts: int) -> dict:
    """A 2-replica PyTorchJob (Master + Worker, restartPolicy OnFailure: the kubelet restarts a
    failed container in its pod) of the same image and training, run with torchrun on the
    variables training-operator sets. DDPJOB_NAME/NAMESPACE/NODE_RANK are set only so that the
    kill script finds the worker as it does in a DDPJob's pod."""
    def replica(rank: int) -> dict:
        env = [*ONE_THREAD_ENV, {"name": "DDPJOB_NAME", "value": name},
               {"name": "DDPJOB_NAMESPACE", "value": namespace}, {"name": "NODE_RANK", "value": str(rank)}]
        container = {
            "name": PYTORCHJOB_CONTAINER, "image": IMAGE, "imagePullPolicy": "IfNotPresent", "env": env,
            "command": ["torchrun", "--rdzv-backend=static", "--nnodes=2", "--nproc-per-node=1",
                        "--node-rank=$(PET_NODE_RANK)", "--master-addr=$(MASTER_ADDR)",
                        "--master-port=$(MASTER_PORT)", "-m", "ddptrainer.main", *training_args()],
            "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}]}
        return {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": {
            "terminationGracePeriodSeconds": 10, "containers": [container],
            "volumes": [hostpath_volume("checkpoints", folder)]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"runPolicy": {"backoffLimit": restarts + 10},
                     "pytorchReplicaSpecs": {"Master": replica(0), "Worker": replica(1)}}}


def pytorchjob(e2e: E2E, restarts: int, folder: Path) -> BenchJob:
    name = "restart-pytorchjob"
    e2e.custom.create_namespaced_custom_object("kubeflow.org", "v1", e2e.namespace, "pytorchjobs",
                                               pytorchjob_manifest(name, e2e.namespace, str(folder), restarts))
    return BenchJob(name, f"{name}-master-0", f"{name}-worker-0", PYTORCHJOB_CONTAINER,
                    lambda: "container restart (restartPolicy OnFailure)",
                    lambda: e2e.custom.delete_namespaced_custom_object(
                        "kubeflow.org", "v1", e2e.namespace, "pytorchjobs", name))


def run_mode(e2e: E2E, mode: str, restarts: int, shared: Path, cap_seconds: float) -> list[dict[str, Any]]:
    folder = shared / f"{e2e.namespace}-{mode.lower()}"
    prepare_shared_dir(e2e, str(folder))
    job = pytorchjob(e2e, restarts, folder) if mode == PYTORCHJOB else ddpjob(e2e, mode, restarts, folder)
    watch = PhaseWatch(e2e, job.name) if mode != PYTORCHJOB else None
    rows: list[dict[str, Any]] = []
    try:
        killed_at = 0.0
        for attempt in range(restarts):
            # The current attempt (started after the last kill) past a checkpoint of its own, so
            # that every round resumes from a fresh one.
            def trained_past_a_checkpoint():
                events = pod_events(e2e, job.node0_pod, job.container)
                begun = [i for i, e in enumerate(events) if e["event"] == "start" and e.get("time", 0) > killed_at]
                if not begun:
                    return False
                first = events[begun[-1]].get("step", 0)
                steps = [e["step"] for e in events[begun[-1]:] if e["event"] == "progress"]
                return bool(steps) and steps[-1] >= (first // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY + 3
            wait_for(trained_past_a_checkpoint, 300, f"{mode}: attempt {attempt} to train past a checkpoint", 0.5)
            killed = e2e.cluster.kubectl("exec", "-n", e2e.namespace, job.victim_pod, "-c", job.container, "--",
                                         "python", "-c", KILL_AND_TIME, job.name, e2e.namespace, "1", check=False)
            match = re.search(r"killed at ([0-9.]+)", killed.stdout)
            if killed.returncode != 0 or match is None:
                raise RuntimeError(f"killing node 1's worker: {killed.stderr.strip()}")
            killed_at = float(match.group(1))
            try:
                milestones = wait_for(lambda: next_attempt_milestones(
                    pod_events(e2e, job.node0_pod, job.container), killed_at), cap_seconds,
                    f"{mode}: attempt {attempt + 1}'s first step", 0.5)
            except TimeoutError:
                rows.append({"attempt": attempt + 1, "restartMode": job.restart_mode(), "capped_s": cap_seconds})
                print(f"{mode} restart {attempt + 1}/{restarts}: no training step within the cap of "
                      f"{cap_seconds:g} s; this mode's rounds end here", file=sys.stderr, flush=True)
                break
            restarting = watch.first("Restarting", killed_at) if watch else None
            row = {key: milestones[key[:-2]] - killed_at for _, key, _ in PHASES}
            row.update({"attempt": attempt + 1, "restartMode": job.restart_mode(),
                        "resumed_step": milestones["resumed_step"],
                        "restarting_s": None if restarting is None else restarting - killed_at})
            rows.append(row)
            print(f"{mode} restart {attempt + 1}/{restarts} ({row['restartMode']}): "
                  f"first step {row['first_step_s']:.2f} s after the kill", file=sys.stderr, flush=True)
    finally:
        if watch:
            watch.stop()
        job.delete()
    return rows


def start_training_operator(context: str, run_dir: Path):
    """Kubeflow's training-operator v1.8.1 as a host process against the kind cluster
    (benchmarks/peer_controllers.py: as its manifests set it up, with its ServiceAccount)."""
    import base64

    from benchmarks.peer_controllers import TrainingOperator

    kubectl = Kubectl(None, context)
    config = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    cluster = config["clusters"][0]["cluster"]
    run_dir.mkdir(parents=True, exist_ok=True)
    ca_cert = run_dir / "ca.crt"
    ca_cert.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    template = run_dir / "init-pytorch.yaml"
    template.write_text(INIT_CONTAINER_TEMPLATE.replace("IMAGE", IMAGE))
    return TrainingOperator(kubectl, cluster["server"], ca_cert, run_dir,
                            extra_flags=[f"--pytorch-init-container-template-file={template}"]).start()


#: The training-operator adds an init container to a PyTorchJob's Worker pods that waits for the
#: master's name to resolve: `nslookup` in alpine:3.10, which kind cannot pull here (no
#: registry). The same wait, in the trainer image (already on the nodes) and in Python; the
#: operator fills in the master's address and its default of 100 tries, 2 s apart, as its own
#: template does (pkg/controller.v1/pytorch/initcontainer.go). Its 20 MiB memory limit would not
#: hold a Python process: no limit here.
INIT_CONTAINER_TEMPLATE = """\
- name: init-pytorch
  image: IMAGE
  imagePullPolicy: IfNotPresent
  command: ["python", "-c", "import socket, sys, time\\nfor _ in range({{.MaxTries}}):\\n    try:\\n        socket.getaddrinfo('{{.MasterAddr}}', None); sys.exit(0)\\n    except OSError:\\n        print('waiting for master', flush=True); time.sleep(2)\\nsys.exit(1)"]
"""


def run(args: argparse.Namespace) -> dict[str, Any]:
    kind_up()
    context = f"kind-{CLUSTER}"
    shared = Path(os.environ.get("DDPJOB_KIND_SHARED_DIR")
                  or Path.home() / ".cache" / "ddpjob" / "kind" / f"shared-{CLUSTER}")
    if not shared.is_dir():
        sys.exit(f"{shared}: the folder scripts/kind/up.sh mounts into the kind nodes is missing")
    kubectl = Kubectl(None, context)
    cluster = KindCluster(kubectl, api_client_from_kubeconfig(None, context), context)
    restarts = 1 if args.smoke else args.restarts
    namespace = f"bench-restart-{secrets.token_hex(3)}"
    kubectl("create", "namespace", namespace)
    wait_for(lambda: kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
             30, "the namespace's default ServiceAccount")
    e2e = E2E(cluster, namespace, IMAGE)
    modes: dict[str, list] = {}
    peer = None
    try:
        if PYTORCHJOB in args.modes.split(","):
            peer = start_training_operator(context, Path(args.results_dir).parent / ".runs" / namespace)
        for mode in args.modes.split(","):
            modes[mode] = run_mode(e2e, mode, restarts, shared, args.cap_seconds)
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        if peer is not None:
            peer.stop()
    stats = {mode: {key: summarize([r[key] for r in rows if r.get(key) is not None]) for _, key in STEPS}
             for mode, rows in modes.items()}
    figures = {f"{mode}.{key}.median": s[key]["median"] for mode, s in stats.items() for _, key in STEPS
               if s[key]["n"]}
    return {"params": {"restarts": restarts, "modes": list(modes), "nnodes": 2, "target": "kind",
                       "checkpoint_every": CHECKPOINT_EVERY, "image": IMAGE, "cap_seconds": args.cap_seconds,
                       "peer": f"training-operator {PEER_VERSION}" if PYTORCHJOB in modes else None},
            "figures": figures, "stats": stats, "runs": modes}


def report(results: dict[str, Any]) -> str:
    p, stats = results["params"], results["stats"]
    modes = p["modes"]
    rows = [(label, *(stats[m][key].get("median") for m in modes), *(stats[m][key].get("p95") for m in modes))
            for label, key in STEPS]
    parts = []
    for label, key, before in PHASES:
        medians = []
        for m in modes:
            runs = [r for r in results["runs"][m] if r.get(key) is not None]
            spans = [r[key] - (r[before] if before else 0.0) for r in runs]
            medians.append(summarize(spans).get("median"))
        parts.append((label, *medians))
    done_as = {m: sorted({str(r["restartMode"]) for r in results["runs"][m]}) for m in modes}
    counted = ", ".join(f"{m} {sum(1 for r in results['runs'][m] if 'first_step_s' in r)}" for m in modes)
    capped = [f"{m}: restart {r['attempt']} reached no training step within {r['capped_s']:g} s"
              for m in modes for r in results["runs"][m] if "capped_s" in r]
    return (f"Restart on kind: up to {p['restarts']} SIGKILLs of node 1's training process per mode, a 2-node "
            f"job of the trainer image (seconds after the kill; restarts measured: {counted}; done as {done_as})"
            + ("; " + "; ".join(capped) if capped else "") + "\n\n"
            + table(["milestone", *(f"{m} median" for m in modes), *(f"{m} p95" for m in modes)], rows)
            + "\n\nwhere it goes (medians of each phase)\n\n"
            + table(["phase", *modes], parts))


def main(argv=None) -> None:
    run_and_record(NAME, parser().parse_args(argv), run, report)


if __name__ == "__main__":
    main()
