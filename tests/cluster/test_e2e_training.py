"""End-to-end: real training jobs from `kubectl apply` to Succeeded."""
from __future__ import annotations

import os
import queue
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.testbed.kube import kubectl_binary

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    EXAMPLES, ONE_THREAD_ENV, REPO_ROOT, TINY_TRAINING_ARGS, ddpjob_manifest, e2e, table_rows,
    terminated_state, trainer_events,
)

pytestmark = pytest.mark.cluster
TRAINING_TIMEOUT = 240  # seconds; a run takes 20-40 s on 2 cores


def readme_kind_quick_start() -> list[str]:
    """The commands of the README's "Try it on a laptop (kind)" block, comments dropped."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Try it on a laptop (kind)", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lines = (line.split("#", 1)[0].strip() for line in block.splitlines())
    return [line for line in lines if line]


def namespaced_kubeconfig(kubectl, namespace: str, path: Path) -> dict:
    """The environment of a user whose kubeconfig is the cluster's with ``namespace`` as its
    context's: the README's commands then run as written, in the test's own namespace."""
    path.write_text(kubectl("config", "view", "--raw", "--minify").stdout)
    env = {**os.environ, "KUBECONFIG": str(path)}
    subprocess.run([kubectl_binary(), "config", "set-context", "--current", f"--namespace={namespace}"],
                   env=env, check=True, capture_output=True)
    return env


def watch_until(command: list[str], env: dict, done, timeout: float) -> list[str]:
    """The lines ``command`` prints until one satisfies ``done`` (then it is stopped)."""
    proc = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=1).rstrip("\n"))
            except queue.Empty:
                if proc.poll() is not None:
                    break
                continue
            if done(seen[-1]):
                return seen
    finally:
        proc.kill()
        proc.wait()
    raise AssertionError(f"{shlex.join(command)}: never printed the line waited for:\n" + "\n".join(seen))


@pytest.mark.kubelet
def test_example_trains_to_success_with_falling_loss(e2e, kubectl, tmp_path):
    """The README's kind quick start word for word (its kubectl lines as written, in the test's
    namespace through the kubeconfig's context): examples/ddpjob.yaml, unchanged, trains to
    Succeeded with a falling loss, and `kubectl get ddpjobs -w` shows it get there."""
    commands = readme_kind_quick_start()
    assert commands == ["make kind-up", "export KUBECONFIG=~/.cache/ddpjob/kind/ddpjob.kubeconfig",
                        "kubectl apply -f examples/ddpjob.yaml", "kubectl get ddpjobs -w",
                        "make kind-down"], commands
    if not e2e.local and not os.environ.get("DDPJOB_CACHE"):  # the file make kind-up writes
        written = Path(commands[1].split("=", 1)[1]).expanduser()
        assert Path(os.environ["KUBECONFIG"]).resolve() == written.resolve()
    env = namespaced_kubeconfig(kubectl, e2e.namespace, tmp_path / "user.kubeconfig")
    apply = subprocess.run([kubectl_binary(), *shlex.split(commands[2])[1:]], env=env, cwd=REPO_ROOT,
                           capture_output=True, text=True)
    assert apply.returncode == 0 and "ddpjob.dev/ddpjob-example created" in apply.stdout, apply
    watched = watch_until([kubectl_binary(), *shlex.split(commands[3])[1:]], env,
                          lambda line: line.split()[:2] == ["ddpjob-example", "Succeeded"], TRAINING_TIMEOUT)
    assert watched[0].split()[:2] == ["NAME", "PHASE"], watched
    status = e2e.wait_until_finished("ddpjob-example", TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert (status["reason"], status["restarts"], status["nnodes"]) == ("AllNodesSucceeded", 0, 2)
    assert status.get("completionTime") and status.get("startTime")
    if not e2e.local:  # a real scheduler with two workers: one pod on each
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in e2e.pods("ddpjob-example")}
        assert len(set(placed.values())) == 2, placed

    log = e2e.wait_for_logs("ddpjob-example-node-0", "ddptrain: done")
    start, = trainer_events(log, "start")
    assert (start["world_size"], start["backend"], start["device"]) == ("2", "gloo", "cpu")
    losses = [float(p["loss"]) for p in trainer_events(log, "progress")]
    assert len(losses) >= 2, log
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    done, = trainer_events(log, "done")
    assert done["step"] == done["total_steps"] == start["total_steps"]

    table = kubectl("get", "ddpjobs", "-n", e2e.namespace).stdout
    columns, [row] = table_rows(table)
    assert columns == ["NAME", "PHASE", "READY", "RESTARTS", "DISRUPTIONS", "PROGRESS", "ETA", "QUEUE", "AGE"], table
    # PROGRESS and ETA may be empty (ETA always is once the job is over).
    assert (row["NAME"], row["PHASE"], row["RESTARTS"], row["ETA"]) == ("ddpjob-example", "Succeeded", "0", ""), table
    assert row["READY"].endswith("/2"), table
    wide = kubectl("get", "ddpjobs", "-n", e2e.namespace, "-o", "wide").stdout.splitlines()
    assert "REASON" in wide[0].split() and "AllNodesSucceeded" in wide[1].split(), wide


# Not on kind (no `kubelet` mark): what it asserts is the entry point's and the operator's
# (the world, the workers' summary), and kind already has the kubelet parts: several processes
# per pod from the image (test_e2e_launch_styles' style 1), the termination message
# (test_e2e_failures' bad configuration). 9 torch processes fewer in the kind tier.
def test_three_nodes_two_processes_each_train_six_ranks(e2e):
    """3 nodes x 2 processes per node = 6 ranks, under torchrun in each pod."""
    name = "six-ranks"
    # 96 samples / 6 ranks / batch 8 = 2 steps per epoch; 2 epochs.
    e2e.create(ddpjob_manifest(
        name, e2e.image, nnodes=3, nprocPerNode=2, env=ONE_THREAD_ENV,
        args=[*TINY_TRAINING_ARGS, "--fake-size=96", "--batch-size=8", "--epochs=2",
              "--log-every=1", "--checkpoint-dir=/tmp/ckpt", "--checkpoint-every=0"]))
    status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0
    assert [(n["nodeRank"], n["phase"]) for n in status["nodes"]] == [
        (0, "Succeeded"), (1, "Succeeded"), (2, "Succeeded")]

    log = e2e.wait_for_logs(f"{name}-node-0", "ddptrain: done")
    start, = trainer_events(log, "start")
    assert start["world_size"] == "6" and start["global_batch_size"] == "48", start
    done, = trainer_events(log, "done")
    assert (done["step"], done["total_steps"], done["world_size"]) == ("4", "4", "6"), done
    # Every pod's two workers finished: each pod's termination message is its workers' summary.
    for rank in range(3):
        state = terminated_state(e2e.pod(f"{name}-node-{rank}"))
        assert state["exitCode"] == 0, state
        assert f"node {rank}: exit 0" in state["message"], state
        assert "completed: step=4/4" in state["message"] and "world_size=6" in state["message"]


def test_plain_env_script_runs_unmodified(e2e, kubectl):
    """a user's plain env:// script (one process per pod, no torchrun), shipped in a
    ConfigMap by examples/ddpjob-plain-env.yaml, applied unchanged."""
    kubectl("apply", "-n", e2e.namespace, "-f", str(EXAMPLES / "ddpjob-plain-env.yaml"))
    status = e2e.wait_until_finished("plain-env-ddp", TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0
    for rank in range(2):
        log = e2e.wait_for_logs(f"plain-env-ddp-node-{rank}", f"rank {rank}/2 ok")
        assert "parameters agree, all-reduce sum 3" in log, log
