"""Failures with a cause: a lost or hung peer gives 13 in bounded time; a bad flag gives 2.

These ranks are started the way a one-process-per-pod script is, without torchrun: each with
the pod's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (ddpjob.contract), so this also
covers that launch style.
"""
from __future__ import annotations

import signal
import time

import pytest
import torch

from ddpjob.contract import ExitCode

pytestmark = pytest.mark.multiprocess


def _start_ranks(mp, tmp_path, env, *extra):
    port = mp.free_port()
    args = [*mp.TINY, "--fake-size", "100000", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--checkpoint-every", "0", "--collective-timeout-seconds", "5", *extra]
    procs, logs = [], []
    for rank in range(2):
        rank_env = dict(env, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        logs.append(tmp_path / f"rank-{rank}.log")
        procs.append(mp.start([*mp.pod_entry()[:1], "-m", "ddptrainer.main", *args],
                              rank_env, logs[-1]))
    return procs, logs


def _stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["killed", "hung"])
def test_lost_or_hung_peer_gives_13_in_bounded_time(mp, tmp_path, trainer_env, how):
    procs, logs = _start_ranks(mp, tmp_path, trainer_env)
    try:
        mp.wait_for_text(logs[0], "step=4/", procs[0], timeout=60)
        # killed: the connection resets at once; hung (SIGSTOP): the collective timeout (5 s)
        procs[1].send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        stopped = time.monotonic()
        code = procs[0].wait(timeout=40)
        took = time.monotonic() - stopped
    finally:
        _stop_all(procs)
    text = logs[0].read_text()
    assert code == ExitCode.PEER_LOST, text[-3000:]
    assert took < 30
    assert "ddptrain: error: peer lost: rank 0" in text
    assert "Traceback" not in text


@pytest.mark.timeout(60)
def test_bad_flag_is_one_line_and_exit_2(mp, trainer_env, tmp_path):
    proc = mp.run([*mp.pod_entry()[:1], "-m", "ddptrainer.main", "--batch-size", "0"],
                  trainer_env, timeout=50)
    assert proc.returncode == ExitCode.BAD_CONFIG
    assert proc.stderr.strip().splitlines() == [
        "ddptrain: error: --batch-size: must be an integer from 1 to 65536, got 0"]
    assert (tmp_path / "termination-log").read_text().startswith(
        "ddptrain: bad configuration: --batch-size")


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_asked_for_where_none_is_gives_2_not_a_hang(mp, trainer_env):
    proc = mp.run(mp.torchrun(2, *mp.trainer(*mp.TINY, "--device", "gpu")), trainer_env,
                  timeout=50)
    assert proc.returncode != 0
    assert "ddptrain: error: --device: gpu was asked for but no CUDA device is visible" \
        in proc.stderr
    assert "exitcode  : 2" in proc.stderr  # each worker exited 2 (torchrun itself says 1)
