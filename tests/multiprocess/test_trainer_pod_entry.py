"""ddptrain-pod: waits for the master (bounded), joins nodes, and exits with honest codes."""
from __future__ import annotations

import os
import re
import signal
import textwrap
import time

import pytest

from ddpjob.contract import ExitCode

pytestmark = pytest.mark.multiprocess

# A user script (--script): rank 1 exits 2 (say, a bad flag of its own), rank 0 would run on.
EXIT_2_ON_RANK_1 = textwrap.dedent('''
    import os, sys, time
    if os.environ["RANK"] == "1":
        time.sleep(0.5)
        sys.exit(2)
    time.sleep(60)
''')

# Rank 1 announces its pid and waits to be killed; rank 0 waits too.
WAIT_TO_BE_KILLED = textwrap.dedent('''
    import os, sys, time
    open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"] + ".pid"), "w").write(
        str(os.getpid()))
    time.sleep(60)
''')


def _node_env(env, nnodes, node_rank, port, timeout=30, **extra):
    return dict(env, PET_NNODES=str(nnodes), PET_NODE_RANK=str(node_rank),
                PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port),
                DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS=str(timeout), **extra)


def _termination_message(tmp_path):
    return (tmp_path / "termination-log").read_text()


@pytest.mark.timeout(60)
def test_worker_exit_2_gives_pod_exit_2_not_torchruns_1(mp, tmp_path, trainer_env):
    script = tmp_path / "user.py"
    script.write_text(EXIT_2_ON_RANK_1)
    env = dict(trainer_env, PET_NPROC_PER_NODE="2")
    proc = mp.run(mp.pod_entry("--script", str(script)), env, timeout=50)
    assert proc.returncode == ExitCode.BAD_CONFIG, proc.stderr[-3000:]
    message = _termination_message(tmp_path)
    assert "worker rank 1 exited 2 (bad configuration (permanent))" in message


@pytest.mark.timeout(60)
def test_trainer_bad_flag_through_pod_entry(mp, tmp_path, trainer_env):
    env = dict(trainer_env, PET_NPROC_PER_NODE="2")
    proc = mp.run(mp.pod_entry("--model", "tiny-cnn", "--lr", "-1"), env, timeout=50)
    assert proc.returncode == ExitCode.BAD_CONFIG
    # one line from the trainer (local rank 0 speaks for the node), no traceback
    assert proc.stderr.count("ddptrain: error: --lr: must be a finite number > 0") == 1
    assert "Traceback" not in proc.stderr
    assert "--lr: must be a finite number > 0" in _termination_message(tmp_path)


@pytest.mark.timeout(60)
def test_worker_killed_by_signal_gives_128_plus_n(mp, tmp_path, trainer_env):
    """A SIGKILLed worker (the OOM killer's way) is the root cause: 137, not torchrun's 1
    and not the 143 of the survivor torchrun then stops."""
    script = tmp_path / "user.py"
    script.write_text(WAIT_TO_BE_KILLED)
    env = dict(trainer_env, PET_NPROC_PER_NODE="2")
    log = tmp_path / "pod.log"
    proc = mp.start(mp.pod_entry("--script", str(script), str(tmp_path)), env, log)
    try:
        pid_file = tmp_path / "rank-1.pid"
        deadline = time.monotonic() + 40
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        code = proc.wait(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + signal.SIGKILL, log.read_text()[-3000:]
    assert "worker rank 1 exited 137" in _termination_message(tmp_path)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("master", ["nosuchhost.invalid", "127.0.0.1"])
def test_unreachable_master_gives_12_after_the_bound(mp, tmp_path, trainer_env, master):
    """Node 1 waits for an unresolvable name / a closed port, logs it, and gives up at 3 s."""
    env = dict(_node_env(trainer_env, 2, 1, mp.free_port(), timeout=3), PET_MASTER_ADDR=master)
    started = time.monotonic()
    proc = mp.run(mp.pod_entry("--model", "tiny-cnn"), env, timeout=25)
    took = time.monotonic() - started
    assert proc.returncode == ExitCode.RENDEZVOUS_TIMEOUT, proc.stderr[-3000:]
    assert 3 <= took < 20
    assert f"waiting for master {master}:" in proc.stderr
    assert "rendezvous timeout" in _termination_message(tmp_path)


@pytest.mark.timeout(60)
def test_node_0_alone_gives_12_when_the_others_never_come(mp, tmp_path, trainer_env):
    env = _node_env(trainer_env, 2, 0, mp.free_port(), timeout=3)
    proc = mp.run(mp.pod_entry("--model", "tiny-cnn"), env, timeout=50)
    assert proc.returncode == ExitCode.RENDEZVOUS_TIMEOUT, proc.stderr[-3000:]
    assert "did not meet" in _termination_message(tmp_path)


@pytest.mark.timeout(120)
def test_second_node_started_first_waits_then_both_train(mp, tmp_path, trainer_env):
    """Two nodes on this machine; node 1 starts 3 s before node 0 (the DNS-lag case).

    Node 1 says nothing in its first 30 s of waiting (node 0 importing torch is no news), so
    the proof that it waited is its "reachable after ... attempts" line once node 0 is up."""
    port = mp.free_port()
    args = [*mp.TINY, "--fake-size", "32", "--checkpoint-dir", str(tmp_path / "ckpt")]
    logs = {rank: tmp_path / f"node-{rank}.log" for rank in (0, 1)}
    procs = {}
    try:
        env1 = _node_env(trainer_env, 2, 1, port, timeout=90,
                         DDPJOB_TERMINATION_LOG=str(tmp_path / "term-1"))
        procs[1] = mp.start(mp.pod_entry(*args), env1, logs[1])
        mp.wait_for_text(logs[1], "node_rank=1 nnodes=2", procs[1], timeout=30)
        time.sleep(3)
        assert procs[1].poll() is None, logs[1].read_text()[-2000:]
        env0 = _node_env(trainer_env, 2, 0, port, timeout=90,
                         DDPJOB_TERMINATION_LOG=str(tmp_path / "term-0"))
        procs[0] = mp.start(mp.pod_entry(*args), env0, logs[0])
        codes = {rank: p.wait(timeout=90) for rank, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    assert codes == {0: 0, 1: 0}, logs[0].read_text()[-2000:] + logs[1].read_text()[-2000:]
    out1 = logs[1].read_text()
    assert re.search(rf"master 127\.0\.0\.1:{port} reachable at 127\.0\.0\.1 after "
                     r"[0-9.]+s \([0-9]+ attempts\)", out1), out1[-2000:]
    assert "starting torchrun" in out1
    out0 = logs[0].read_text()
    assert "world_size=2 backend=gloo" in out0 and "ddptrain: done step=2/2" in out0
    assert "ddptrain: start" not in logs[1].read_text()  # global rank 0 alone prints progress
    assert "completed: step=2/2" in (tmp_path / "term-0").read_text()
