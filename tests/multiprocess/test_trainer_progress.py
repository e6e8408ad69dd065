"""The built-in trainer reports progress with no setup: every rank writes its report, and the
pod entry point serves them on the contract's port while training runs."""
from __future__ import annotations

import json
import sys
import time
import urllib.request

import pytest

from ddpjob import contract

pytestmark = pytest.mark.multiprocess


def served(port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{contract.PROGRESS_PATH}", timeout=2) as r:
            return json.load(r)["ranks"]
    except OSError:
        return {}


def test_every_rank_reports_and_the_pod_entry_point_serves_the_reports(mp, tmp_path, trainer_env):
    port = mp.free_port()
    folder = tmp_path / "progress"
    env = {**trainer_env, "PET_NPROC_PER_NODE": "2", contract.DDPJOB_PROGRESS_DIR: str(folder),
           contract.DDPJOB_PROGRESS_PORT: str(port)}
    proc = mp.start(mp.pod_entry(*mp.TINY, "--fake-size", "1600", "--epochs", "1", "--checkpoint-every", "20",
                                 "--checkpoint-dir", str(tmp_path / "checkpoints")), env, tmp_path / "log")
    try:
        deadline, ranks = time.monotonic() + 120, {}
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = served(port)
            if set(ranks) == {"0", "1"}:
                break
            time.sleep(0.2)
        assert set(ranks) == {"0", "1"}, (ranks, (tmp_path / "log").read_text()[-3000:])
        assert ranks["0"]["total_steps"] == 100 and ranks["0"]["age_seconds"] >= 0, ranks
        assert proc.wait(timeout=180) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    final = {r: json.loads((folder / contract.progress_file_name(r)).read_text()) for r in (0, 1)}
    assert [final[r]["step"] for r in (0, 1)] == [100, 100], final
    assert final[0]["epochs"] == 1 and final[0]["loss"] > 0 and final[0]["throughput"] > 0, final
    # what a periodic checkpoint held each rank up, and the seconds between two: the operator's
    # checkpoint-interval advice (api/checkpoint_advice.py)
    for r in (0, 1):
        assert 0 < final[r]["checkpoint_seconds"] < 60 and final[r]["checkpoint_interval_seconds"] > 0, final


SPAWNING_SCRIPT = '''
import os, sys
import torch.distributed as dist
import torch.multiprocessing as mp
from ddptrainer.report import report_progress


def work(local_rank, first_rank, world_size):
    report_progress(0, 10, force=True)  # before the process group: only $RANK is known
    dist.init_process_group("gloo", rank=first_rank + local_rank, world_size=world_size)
    report_progress(5, 10, force=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(work, args=(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])), nprocs=2)
    sys.stdout.flush()
    os._exit(0)  # gloo's exit abort: docs/launch-styles.md
'''


def test_processes_started_by_mp_spawn_report_under_their_own_ranks(mp, tmp_path, trainer_env):
    """mp.spawn's children inherit the pod's RANK (its first rank): once their process group
    has started, each must report under the rank it has in it, or hang detection would see one
    rank where there are two."""
    script = tmp_path / "spawning.py"
    script.write_text(SPAWNING_SCRIPT)
    folder = tmp_path / "progress"
    env = {**trainer_env, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(mp.free_port()), contract.DDPJOB_PROGRESS_DIR: str(folder)}
    result = mp.run([sys.executable, str(script)], env, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    reports = contract.read_progress_reports(str(folder))
    assert sorted(reports) == ["0", "1"], reports
    assert reports["0"]["step"] == 5 and reports["1"]["step"] == 5, reports
