"""End-to-end: `ddpjob status` and `ddpjob logs` on a real 2-node job that restarts once in
place (node 1 fails its first attempt), read through the user's kubeconfig as a user runs them.

One job for both (a job costs ~50 s on kind): the status part runs on both targets; the logs
part needs a kubelet's log endpoint, which the local test bed's node agent does not serve, so
the test bed checks the status only."""
from __future__ import annotations

import shutil

import pytest

from .e2e_support import ddpjob_cli, e2e  # noqa: F401 - e2e is a fixture

pytestmark = pytest.mark.cluster
TIMEOUT = 300
FORGED = "ddptrain-pod: attempt 5 starts (run 0123456789abcdef)"
# Node 1 fails attempt 0 (exit 1: retryable); node 0 waits until the restart order stops it.
# Attempt 1 succeeds on both. Every attempt prints a line that looks like an attempt mark.
SCRIPT = f'''\
import os, sys, time
node, attempt = os.environ["NODE_RANK"], int(os.environ["DDPJOB_RESTART_ATTEMPT"])
print(f"node {{node}} attempt {{attempt}} hello", flush=True)
print({FORGED!r}, flush=True)
if attempt == 0:
    if node == "1":
        time.sleep(3)
        sys.exit(1)
    time.sleep(240)
print(f"node {{node}} attempt {{attempt}} done", flush=True)
'''


def ddpjob(cluster, command: str, *argv: str, plugin: bool = False):
    return ddpjob_cli(cluster, command, *argv, plugin=plugin)


def run_job_that_restarts_once(e2e, tmp_path, name: str) -> dict:
    (tmp_path / "twice.py").write_text(SCRIPT)
    result = ddpjob(e2e.cluster, "submit", str(tmp_path / "twice.py"), "--name", name, "--nnodes", "2",
                    "--image", e2e.image, "-n", e2e.namespace)
    assert result.returncode == 0, result.stderr
    status = e2e.wait_until_finished(name, TIMEOUT)
    assert (status["phase"], status["restarts"], status["restartAttempt"]) == ("Succeeded", 1, 1), status
    return status


@pytest.mark.kubelet
def test_status_and_logs_show_the_restart(e2e, tmp_path):
    name = "restarts-once"
    run_job_that_restarts_once(e2e, tmp_path, name)
    assert_status_shows_the_restart(e2e, name)
    if not e2e.local:  # pods/log needs a real kubelet
        assert_logs_show_both_nodes_and_both_attempts(e2e, name)


def assert_status_shows_the_restart(e2e, name: str) -> None:
    result = ddpjob(e2e.cluster, "status", name, "-n", e2e.namespace)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    text = result.stdout
    assert f"DDPJob {e2e.namespace}/{name}" in text and "Phase:       Succeeded" in text, text
    assert "Attempt:     1   restarts 1/3" in text, text
    failures = text[text.index("Failures:"):].splitlines()
    assert failures[0].startswith("Failures:    1 recorded"), text
    row = failures[2].split()
    assert row[1] == "0" and row[2].startswith("1/") and f"{name}-node-1" in row and "InPlace" in row, text
    assert "Pods:        attempt 1" in text and f"{name}-node-0" in text, text
    if shutil.which("kubectl-ddpjob"):  # installed: kubectl finds the plugin on PATH
        plugin = ddpjob(e2e.cluster, "status", name, "-n", e2e.namespace, plugin=True)
        assert plugin.returncode == 0 and plugin.stdout == text, plugin.stderr

    missing = ddpjob(e2e.cluster, "status", "no-such-job", "-n", e2e.namespace)
    assert missing.returncode == 1 and missing.stdout == "", missing
    assert missing.stderr.strip() == (f"ddpjob status: error: no DDPJob no-such-job in namespace {e2e.namespace}"
                                      f"{' (context ' + e2e.cluster.context + ')' if e2e.cluster.context else ''}"
                                      f": check the name and -n (kubectl get ddpjobs -n {e2e.namespace})")


def assert_logs_show_both_nodes_and_both_attempts(e2e, name: str) -> None:
    result = ddpjob(e2e.cluster, "logs", name, "-n", e2e.namespace)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for node in (0, 1):
        for attempt in (0, 1):
            assert f"node-{node} ==> attempt {attempt} (pod {name}-node-{node})" in lines, result.stdout
        assert f"node-{node} | node {node} attempt 0 hello" in lines, result.stdout
        assert f"node-{node} | node {node} attempt 1 done" in lines, result.stdout
        assert lines.count(f"node-{node} | {FORGED}") == 2, result.stdout  # shown, never believed
    # Attempt 1 starts after attempt 0's lines, node by node.
    assert lines.index(f"node-1 ==> attempt 1 (pod {name}-node-1)") > lines.index("node-1 | node 1 attempt 0 hello")

    only = ddpjob(e2e.cluster, "logs", name, "-n", e2e.namespace, "--rank", "1", "--attempt", "0")
    assert only.returncode == 0, only.stderr
    shown = only.stdout.splitlines()
    assert shown[0] == f"node-1 ==> attempt 0 (pod {name}-node-1)" and "node-1 | node 1 attempt 0 hello" in shown
    # Only node 1's attempt 0: no node-0 line, no attempt 1 header, none of attempt 1's own lines
    # (attempt 0's last lines may name attempt 1: "restarting in place: attempt 1").
    assert not any(line.startswith("node-0") or "==> attempt 1" in line or "node 1 attempt 1 " in line
                   for line in shown), only.stdout
    assert "node-1 | ddptrain-pod: restarting in place: attempt 1" in shown, only.stdout

    # A window of the log's end: its attempt comes from the log's first line, read apart.
    tail = ddpjob(e2e.cluster, "logs", name, "-n", e2e.namespace, "--rank", "0", "--tail", "3")
    shown = tail.stdout.splitlines()
    assert tail.returncode == 0 and shown[0] == f"node-0 ==> attempt 1 (pod {name}-node-0)", tail
    assert "node-0 | node 0 attempt 1 done" in shown and "==> attempt 0" not in tail.stdout, tail
