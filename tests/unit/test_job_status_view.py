"""`ddpjob status JOB`: the screen (ddpjob.client.job_view, pure) on statuses the operator
writes, the worst bounded one included, and the one-line errors of the command."""
from __future__ import annotations

import datetime as dt
import io
import re
from dataclasses import replace

import pytest

from ddpjob.api import status as S
from ddpjob.cli.main import build_parser, main
from ddpjob.client import cluster
from ddpjob.client.job_view import FAILURES_SHOWN, NODES_SHOWN, render_status
from tests.support.status_bounds import WORST_CHAR, worst_valid

pytestmark = pytest.mark.unit
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.timezone.utc)


def job(status: S.JobStatus, **spec) -> dict:
    return {"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "u-1"},
            "spec": {"nnodes": 2, **spec}, "status": status.to_dict()}


def restarted_once() -> S.JobStatus:
    """A 2-node job whose node 1 was killed once and that restarted in place, now Running."""
    status = S.with_phase(S.JobStatus(nnodes=2), S.RUNNING, "AllNodesRunning", "2/2 node(s) running", NOW)
    status = S.with_failure(status, S.FailureRecord(
        time="2026-12-02T11:58:00Z", attempt=0, nodeRank=1, rank=3, pod="train-node-1", nodeName="worker-b",
        reason="Error", exitCode=137, message="killed by SIGKILL (the OOM killer?)", restartMode="InPlace"))
    status = S.with_nodes(status, [
        S.NodeState(nodeRank=0, pod="train-node-0", phase="Running", ready=True, nodeName="worker-a"),
        S.NodeState(nodeRank=1, pod="train-node-1", phase="Running", ready=True, nodeName="worker-b")])
    return replace(status, restarts=1, restartAttempt=1, startTime="2026-12-02T11:50:00Z",
                   failedNode=S.FailedNode(nodeRank=1, pod="train-node-1", exitCode=137, reason="Error",
                                           message="Traceback (most recent call last):\n  File x\nRuntimeError: boom"),
                   progress=S.Progress(summary="120/200 (60%)", eta="1m05s", step=120, totalSteps=200, epoch=2,
                                       epochs=2, loss=0.2345, throughput=812.5, ranksReporting=4, attempt=1),
                   goodput=S.Goodput(summary="training 81% of 10m; 1 restart cost 1m, 20 steps re-done"),
                   excludedNodes=(S.ExcludedNode(nodeName="worker-c", failures=2, reason="OOMKilled",
                                                 since="2026-12-02T11:40:00Z", message="2 OOMKilled there"),))


def test_a_restarted_job_shows_where_it_is_what_it_cost_and_what_failed():
    text = render_status(job(restarted_once(), failurePolicy={"maxRestarts": 5, "maxDisruptions": 2}))
    assert text.startswith("DDPJob team-a/train\n"), text
    assert "Phase:       Running (AllNodesRunning)" in text and "2/2 node(s) running" in text
    assert "Attempt:     1   restarts 1/5   disruptions 0/2" in text
    assert "120/200 (60%), ETA 1m05s, epoch 2/2, loss 0.2345" in text
    assert "training 81% of 10m; 1 restart cost 1m" in text
    failures = text[text.index("Failures:"):text.index("Failed node:")]
    header, row = failures.splitlines()[1:3]
    assert header.split() == ["TIME", "ATTEMPT", "NODE/RANK", "POD", "K8S", "NODE", "REASON", "EXIT", "RESTART",
                              "MESSAGE"]
    assert row.split()[:8] == ["2026-12-02T11:58:00Z", "0", "1/3", "train-node-1", "worker-b", "Error", "137",
                               "InPlace"], row
    assert "killed by SIGKILL" in row
    assert "    | RuntimeError: boom" in text  # the failing rank's last lines
    assert "worker-c" in text and "OOMKilled" in text
    pods = text[text.index("Pods:"):]
    assert "attempt 1" in pods and "train-node-0" in pods and "worker-a" in pods


def test_a_job_the_operator_has_not_seen_yet_says_so():
    text = render_status({"metadata": {"name": "x", "namespace": "n"}, "spec": {"nnodes": 3}})
    assert "the operator has not seen the job" in text
    assert "0/3 ready" in text and "restarts 0/3" in text  # maxRestarts' default
    assert "Failures:    none" in text


def test_a_failed_job_shows_the_reason_that_ended_it():
    status = S.with_phase(S.JobStatus(nnodes=1), S.FAILED, "RestartBudgetExhausted", "3 restarts used", NOW)
    # A later pass that failed to write overwrites the top-level reason; the condition stays.
    status = replace(status, reason="ReconcileError", message="the API server refused a write")
    text = render_status(job(status))
    assert "Failed (RestartBudgetExhausted)" in text and "3 restarts used" in text, text


def test_the_worst_bounded_status_gives_a_bounded_screen_that_cannot_steer_the_terminal():
    status = worst_valid()
    text = render_status(job(status))
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", text)  # every control character escaped
    assert WORST_CHAR not in text and "\\x01" in text
    lines = text.splitlines()
    # The lists are cut to a screen: a few failures, a few nodes, the failing rank's last lines.
    assert len(lines) < 80, len(lines)
    assert max(map(len, lines)) < 2000
    assert f"{S.FAILURE_HISTORY_LIMIT} recorded" in text and f"{S.FAILURE_HISTORY_LIMIT - FAILURES_SHOWN} older" in text
    pods = text[text.index("  Pods:"):].splitlines()
    assert len(pods) == 3 + NODES_SHOWN and pods[-1].endswith(f"and {S.NODES_LISTED - NODES_SHOWN} more node(s) "
                                                             "not listed (the not-healthy ones are listed first)")
    assert len(text.encode()) < 64 * 1024


@pytest.mark.parametrize("control", ["\x1b]0;owned\x07", "\r", "\u202e", "\x9b"])
def test_text_from_pods_is_escaped(control):
    status = S.JobStatus(phase=S.FAILED, reason="Error", message=f"a{control}b",
                         failedNode=S.FailedNode(nodeRank=0, pod="p", message=f"line{control}one\nline two"))
    text = render_status(job(status))
    assert control not in text, repr(text)
    assert "    | line two" in text


# --- the command --------------------------------------------------------------------------
class FakeConnection:
    pass


def run(argv, monkeypatch, get_job=None, connect_error=None):
    def connect(kubeconfig, context):
        if connect_error:
            raise connect_error
        return FakeConnection()

    monkeypatch.setattr(cluster, "connect", connect)
    if get_job is not None:
        monkeypatch.setattr(cluster, "get_job", get_job)
    out, err = io.StringIO(), io.StringIO()
    args = build_parser().parse_args(["status", *argv])
    code = args.handler(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_the_command_prints_the_screen(monkeypatch):
    code, out, err = run(["train", "-n", "team-a"], monkeypatch, get_job=lambda conn, ns, name: job(restarted_once()))
    assert (code, err) == (0, "") and "restarts 1/3" in out


def refuse(status, message):
    def get_job(conn, ns, name):
        if status == 404:
            return None
        raise cluster.ClusterError(message, status)
    return get_job


@pytest.mark.parametrize("status, message, needle", [
    (404, "", "no DDPJob train in namespace team-a: check the name and -n"),
    (403, 'DDPJob team-a/train: ddpjobs.ddpjob.dev "train" is forbidden: User "bob" cannot get',
     "you may not read ddpjobs in namespace team-a: ask for that, or choose another -n or --context"),
    (401, "DDPJob team-a/train: Unauthorized", "log in again"),
    (0, "cannot reach the cluster (https://1.2.3.4): MaxRetryError", "is the cluster up?"),
])
def test_errors_are_one_line_with_what_to_do(monkeypatch, status, message, needle):
    code, out, err = run(["train", "-n", "team-a"], monkeypatch, get_job=refuse(status, message))
    assert code == 1 and out == "" and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_no_kubeconfig_is_one_line(tmp_path, capsys):
    code = main(["status", "train", "--kubeconfig", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 1 and "no usable kubeconfig" in err and "--kubeconfig FILE" in err, err
    assert len(err.strip().splitlines()) == 1


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["status"])
    assert exit_.value.code == 2 and "JOB" in capsys.readouterr().err
