"""ddptrain-pod's pure parts: options, torchrun argv, the honest exit code, the wait, summaries."""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpjob import contract
from ddptrainer import pod_entry, summary
from ddptrainer.pod_entry import (NodeEnv, PodArgs, PodUsageError, choose_exit_code,
                                  normalize_exit_code, parse_pod_args, read_node_env,
                                  torchrun_argv)
from ddptrainer.progress import Progress
from ddptrainer.rendezvous_wait import MasterUnreachable, wait_for_master

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs" / "trainer.md"


# ----------------------------------------------------------------------------- options
def test_trainer_flags_pass_through():
    pod = parse_pod_args(["--model", "resnet50", "--lr", "0.1"])
    assert pod == PodArgs("trainer", "ddptrainer.main", ("--model", "resnet50", "--lr", "0.1"))


def test_pod_options_only_in_front():
    pod = parse_pod_args(["--termination-log", "/t", "--rendezvous-timeout-seconds=5",
                          "--script", "train.py", "--termination-log", "x"])
    assert pod == PodArgs("script", "train.py", ("--termination-log", "x"), "/t", 5)
    assert parse_pod_args(["-m", "my.module", "-m", "z"]).args == ("-m", "z")
    assert parse_pod_args(["--", "--script", "s"]).args == ("--script", "s")


@pytest.mark.parametrize("argv", [["--script"], ["--rendezvous-timeout-seconds", "0"],
                                  ["--rendezvous-timeout-seconds", "soon"]])
def test_bad_pod_options(argv):
    with pytest.raises(PodUsageError):
        parse_pod_args(argv)


def test_node_env_defaults_to_one_plain_node():
    node = read_node_env({}, PodArgs())
    assert node == NodeEnv(nnodes=1, node_rank=0, nproc_per_node="1", master_addr=None)


def test_node_env_from_the_operator():
    env = contract.node_environment(job_name="j", namespace="ns", master_addr="j-node-0.j.ns.svc",
                                    master_port=29500, nnodes=3, nproc_per_node=2, node_rank=2,
                                    restart_attempt=0, device="cpu",
                                    rendezvous_timeout_seconds=45)
    node = read_node_env(env, PodArgs())
    assert (node.nnodes, node.node_rank, node.nproc_per_node) == (3, 2, "2")
    assert (node.master_addr, node.master_port, node.rendezvous_timeout_seconds) == (
        "j-node-0.j.ns.svc", 29500, 45)
    assert read_node_env(env, PodArgs(rendezvous_timeout_seconds=7)).rendezvous_timeout_seconds == 7


@pytest.mark.parametrize("env", [{"PET_NODE_RANK": "x"}, {"PET_NNODES": "2", "PET_NODE_RANK": "2"},
                                 {"DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS": "0"}])
def test_bad_node_env(env):
    with pytest.raises(PodUsageError):
        read_node_env(env, PodArgs())


def test_torchrun_argv_bounds_the_static_rendezvous():
    node = NodeEnv(nnodes=2, node_rank=1, master_addr="m", rendezvous_timeout_seconds=33)
    assert torchrun_argv(PodArgs(args=("--lr", "1")), node, {}) == [
        "--rdzv-conf", "timeout=33", "-m", "ddptrainer.main", "--lr", "1"]
    assert torchrun_argv(PodArgs("script", "t.py", ("a",)), node, {"PET_RDZV_CONF": "x=1"}) == [
        "t.py", "a"]
    assert torchrun_argv(PodArgs("module", "pkg.m"), NodeEnv(), {}) == ["-m", "pkg.m"]


# ----------------------------------------------------------------------------- exit codes
@dataclass
class Failure:
    exitcode: int
    timestamp: int = 0


@pytest.mark.parametrize("failures,expected", [
    ({0: Failure(1)}, (0, 1)),
    ({0: Failure(-15, 5), 1: Failure(2, 6)}, (1, 2)),          # permanent beats everything
    ({0: Failure(13, 1), 1: Failure(3, 9)}, (1, 3)),
    ({0: Failure(13, 1), 1: Failure(-9, 2)}, (1, 137)),         # root cause beats peer lost
    ({0: Failure(143, 1), 1: Failure(1, 2)}, (1, 1)),
    ({0: Failure(13, 3), 1: Failure(143, 3)}, (1, 143)),       # preempted beats peer lost
    ({0: Failure(1, 4), 3: Failure(7, 2)}, (3, 7)),             # earliest root cause
    ({2: Failure(13, 1), 1: Failure(13, 1)}, (1, 13)),          # tie: lowest rank
])
def test_choose_exit_code(failures, expected):
    assert choose_exit_code(failures) == expected


def test_signals_map_to_128_plus_n():
    assert normalize_exit_code(-9) == 137 and normalize_exit_code(-15) == 143
    assert normalize_exit_code(2) == 2


# ----------------------------------------------------------------------------- the wait
def test_wait_returns_once_the_port_accepts():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = wait_for_master("localhost", port, 5, log=lambda m: None)
    assert result.attempts == 1 and result.address in ("127.0.0.1", "::1")


def test_wait_gives_up_after_the_bound_and_logs_sparingly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        now = [0.0]
        logged = []
        with pytest.raises(MasterUnreachable, match=r"not reachable within 60s .*does not accept"):
            wait_for_master("127.0.0.1", port, 60, logged.append, clock=lambda: now[0],
                            sleep=lambda dt: now.__setitem__(0, now[0] + dt))
    # backoff 0.5, 1, 2, 4, 5, 5, ... over 60 s: ~16 attempts; quiet for 30 s, then one line
    # per 15 s at most
    assert 2 <= len(logged) <= 4
    assert all("waiting for master 127.0.0.1" in line for line in logged)


def test_a_master_up_within_seconds_is_no_news():
    """Node 0 importing torch for a second or two: no "Connection refused" line (issue 36)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        now, logged = [0.0], []

        def sleep(seconds):
            now[0] += seconds
            if now[0] >= 1.5:
                s.listen()

        wait_for_master("127.0.0.1", port, 60, logged.append, clock=lambda: now[0], sleep=sleep)
    assert len(logged) == 1 and logged[0].startswith(f"master 127.0.0.1:{port} reachable"), logged


def test_unresolvable_name_is_reported_as_such():
    with pytest.raises(MasterUnreachable, match="does not resolve"):
        wait_for_master("nosuchhost.invalid", 1, 0.1, lambda m: None)


# ----------------------------------------------------------------------------- summaries
def test_termination_message_is_truncated_to_4k(tmp_path):
    path = tmp_path / "term"
    assert summary.write_termination_message("é" * 5000, str(path), explicit=True)
    text = path.read_text()
    assert len(text.encode()) <= 4096 + 1 and text.rstrip().endswith("[truncated]")


def test_default_path_is_written_only_if_it_exists(tmp_path, monkeypatch):
    missing = tmp_path / "termination-log"
    assert not summary.write_termination_message("x", str(missing), explicit=False)
    assert not missing.exists()
    missing.write_text("")
    assert summary.write_termination_message("x", str(missing), explicit=False)
    assert not summary.write_termination_message("x", str(tmp_path / "no" / "f"), explicit=True)
    assert summary.resolve_termination_log(None, {}) == ("/dev/termination-log", False)
    assert summary.resolve_termination_log(None, {"DDPJOB_TERMINATION_LOG": "/e"}) == ("/e", True)
    assert summary.resolve_termination_log("/f", {"DDPJOB_TERMINATION_LOG": "/e"}) == ("/f", True)


def test_worker_endings_roundtrip(tmp_path):
    env = {summary.ENV_SUMMARY_DIR: str(tmp_path)}
    assert summary.leave_ending(0, "done", 3, env)
    assert summary.leave_ending(12, "timed out\nline two", None, env)  # an init guard's verdict
    assert summary.leave_ending(4, "disk full: x", 1, env)
    (tmp_path / "rank-2.txt").write_text("not an ending")
    (tmp_path / "notes.txt").write_text("0\nnot ours")
    endings = summary.read_endings(str(tmp_path))
    assert [(e.code, e.message, e.rank, e.is_guard_verdict) for e in endings] == [
        (4, "disk full: x", 1, False), (0, "done", 3, False), (12, "timed out\nline two", None, True)]
    assert summary.read_endings(None) == [] and summary.read_endings(str(tmp_path / "gone")) == []
    assert not summary.leave_ending(0, "done", 0, {})  # not under ddptrain-pod


def test_a_worker_ending_is_read_only_up_to_the_termination_message_size(tmp_path):
    (tmp_path / "rank-0.txt").write_text("1\n" + "x" * 100_000)
    (ending,) = summary.read_endings(str(tmp_path))
    assert ending.code == 1 and len(ending.message) == summary.MAX_TERMINATION_MESSAGE_BYTES - 1


# ----------------------------------------------------------------------------- progress
def test_progress_text_and_json(capsys):
    import io
    import json

    fields = dict(epoch=2, epochs=3, step=40, total_steps=100, loss=2.103456,
                  images_per_sec=812.44, eta_seconds=73.2, world_size=2, data_wait_fraction=0.05)
    text, js = io.StringIO(), io.StringIO()
    Progress(True, "text", text).progress(**fields)
    Progress(True, "json", js).progress(**fields)
    Progress(False, "text", text).progress(**fields)  # not rank 0: silent
    assert text.getvalue() == ("ddptrain: progress epoch=2/3 step=40/100 loss=2.1035 "
                               "images_per_sec=812.4 eta_seconds=73 world_size=2 "
                               "data_wait_fraction=0.05\n")
    record = json.loads(js.getvalue())
    assert record["world_size"] == 2 and record["step"] == 40 and record["epoch"] == 2
    assert set(record) >= {"epoch", "step", "total_steps", "loss", "images_per_sec",
                           "eta_seconds", "world_size"}


# ----------------------------------------------------------------------------- the docs
def test_docs_exit_code_table_matches_the_contract():
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*([^|]+?)\s*\|", DOCS.read_text(), re.MULTILINE)
    documented = {int(code): meaning for code, meaning in rows}
    assert documented == dict(contract.EXIT_CODE_MEANINGS)


# ----------------------------------------------------------------------------- attempt marks
def test_the_pods_first_line_is_the_mark_of_its_first_attempt(capsys, tmp_path, monkeypatch):
    """Even a pod that fails at once starts its log with the mark `ddpjob logs` anchors on: the
    attempt it was created for, and a run no program of the pod is given."""
    from ddptrainer import pod_entry

    monkeypatch.setattr(pod_entry.signal, "signal", lambda *a: None)
    env = {contract.DDPJOB_RESTART_ATTEMPT: "3", contract.DDPJOB_TERMINATION_LOG: str(tmp_path / "t")}
    assert pod_entry.run(["--rendezvous-timeout-seconds", "0"], env) == int(contract.ExitCode.BAD_CONFIG)
    first = capsys.readouterr().err.splitlines()[0]
    attempt, run = contract.parse_attempt_mark(first)
    assert attempt == 3 and re.fullmatch("[0-9a-f]{16}", run)
    assert run not in repr(env)
    assert pod_entry.run(["--rendezvous-timeout-seconds", "0"], env) == int(contract.ExitCode.BAD_CONFIG)
    assert contract.parse_attempt_mark(capsys.readouterr().err.splitlines()[0])[1] != run  # random per start


def test_torchrun_and_the_workers_get_the_address_the_master_resolved_to():
    # torch's store looks a name up for IPv6 first: where the DNS forwards unknown names to a
    # server that does not answer, every store connection by name waits seconds (kind here)
    node = pod_entry._with_master_address(NodeEnv(nnodes=2, node_rank=1, master_addr="job-node-0.job.ns.svc"),
                                          "10.0.0.7")
    assert torchrun_argv(PodArgs(), node, {"PET_RDZV_CONF": "x=1"}) == [
        "--master-addr", "10.0.0.7", "-m", "ddptrainer.main"]
    unresolved = pod_entry._with_master_address(NodeEnv(master_addr="m"), None)
    assert torchrun_argv(PodArgs(), unresolved, {"PET_RDZV_CONF": "x=1"}) == ["-m", "ddptrainer.main"]
    local = pod_entry._with_master_address(NodeEnv(master_addr="127.0.0.1"), "127.0.0.1")
    assert local.master_address is None  # an address already: nothing to pass


def test_resolve_address_answers_an_address_or_none_within_its_bound():
    from ddptrainer.rendezvous_wait import resolve_address

    assert resolve_address("127.0.0.1") == "127.0.0.1"
    assert resolve_address("localhost") in ("127.0.0.1", "::1")
    assert resolve_address("no-such-host.invalid", timeout_seconds=3.0) is None
