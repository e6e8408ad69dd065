"""Checkpoints across restarts: crash and resume equals straight; SIGTERM saves and exits 143."""
from __future__ import annotations

import json
import signal
import textwrap

import pytest
import torch

from ddpjob.contract import ExitCode
from ddptrainer import checkpoint

pytestmark = pytest.mark.multiprocess

# The trainer, except that rank 1 dies like a lost node (no cleanup) right after the
# checkpoint of step CRASH_AFTER_STEP is on disk.
CRASHING_TRAINER = textwrap.dedent('''
    import os, sys
    from ddptrainer import main, train

    crash_after = int(os.environ["CRASH_AFTER_STEP"])
    original_save = train.Trainer._save

    def save_then_crash(self):
        path = original_save(self)
        if self.step == crash_after and self.ctx.rank == 1:
            os._exit(1)
        return path

    train.Trainer._save = save_then_crash
    sys.exit(main.run(sys.argv[1:]))
''')

# 2 ranks x batch 8 over 48 samples: 3 steps an epoch, so 8 steps cross two epoch ends and
# the crash at step 4 falls mid-epoch (the resumed run must skip the batch already done).
RESUME_ARGS = ("--fake-size", "48", "--epochs", "3", "--max-steps", "8", "--checkpoint-every", "4",
               "--log-format", "json")


def _json_lines(text):
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _final_model(folder):
    path = checkpoint.latest_checkpoint(str(folder))
    assert path is not None, f"no checkpoint in {folder}"
    return checkpoint.read(path)


@pytest.mark.timeout(200)
def test_crash_and_resume_equals_straight_run(mp, tmp_path, trainer_env):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = [*mp.TINY, *RESUME_ARGS]
    proc = mp.run(mp.torchrun(2, *mp.trainer(*args, "--checkpoint-dir", str(straight))),
                  trainer_env, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]

    script = tmp_path / "crashing_trainer.py"
    script.write_text(CRASHING_TRAINER)
    crash_env = dict(trainer_env, CRASH_AFTER_STEP="4")
    crashed = mp.run(mp.torchrun(2, str(script), *args, "--checkpoint-dir", str(resumed)),
                     crash_env, timeout=100)
    assert crashed.returncode != 0
    # the epoch end (3) and step 4 were saved; the crash came before anything newer
    assert [s for s, _ in checkpoint.list_checkpoints(str(resumed))] == [3, 4]

    again = mp.run(mp.torchrun(2, *mp.trainer(*args, "--checkpoint-dir", str(resumed))),
                   trainer_env, timeout=100)
    assert again.returncode == 0, again.stderr[-3000:]
    events = _json_lines(again.stdout)
    assert events[0]["event"] == "start" and events[0]["step"] == 4
    assert events[0]["world_size"] == 2
    # Where the resumed start-up went (startup.py): every phase, none negative, the import
    # (torch's) more than nothing.
    phases = {k: v for k, v in events[0].items() if k.startswith("startup_")}
    assert set(phases) == {"startup_import_s", "startup_rendezvous_s", "startup_data_s",
                           "startup_model_and_resume_s"}, events[0]
    assert all(v >= 0 for v in phases.values()) and phases["startup_import_s"] > 0, phases
    steps = [e["step"] for e in events if e["event"] == "progress"]
    assert steps[0] == 6 and steps[-1] == 8  # the step count continues from the checkpoint
    assert events[-1]["event"] == "done" and events[-1]["step"] == 8

    a, b = _final_model(straight), _final_model(resumed)
    assert a["step"] == b["step"] == 8 and a["epoch"] == b["epoch"]
    for name, tensor in a["model"].items():
        torch.testing.assert_close(b["model"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


@pytest.mark.timeout(200)
def test_sigterm_through_pod_entry_saves_and_exits_143(mp, tmp_path, trainer_env):
    """SIGTERM to the pod's main process (what the kubelet does): torchrun forwards it, every
    rank stops at the same step, rank 0 saves, the pod exits 143; a restart continues."""
    ckpt = tmp_path / "ckpt"
    env = dict(trainer_env, PET_NPROC_PER_NODE="2")
    args = [*mp.TINY, "--fake-size", "100000", "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "0"]
    log = tmp_path / "pod.log"
    proc = mp.start(mp.pod_entry(*args), env, log)
    try:
        mp.wait_for_text(log, "step=4/", proc, timeout=90)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == ExitCode.PREEMPTED, text[-3000:]
    saved = checkpoint.list_checkpoints(str(ckpt))
    assert len(saved) == 1, text[-3000:]
    state = checkpoint.read(saved[0][1])  # loadable, complete
    step = state["step"]
    assert step >= 4 and set(state) >= {"model", "optimizer", "epoch", "step", "rng"}
    assert len(state["rng"]) == 2  # every rank's RNG state
    message = (tmp_path / "termination-log").read_text()
    assert "exit 143" in message and f"step={step}/" in message and "preempted" in message

    # A restart resumes from it and the step count goes on.
    more = mp.run(mp.pod_entry(*args, "--max-steps", str(step + 2)), env, timeout=100)
    assert more.returncode == 0, more.stderr[-3000:]
    assert f"resumed from {saved[0][1]} at step={step}" in more.stdout
    assert f"ddptrain: done step={step + 2}/{step + 2}" in more.stdout
    assert f"completed: step={step + 2}/" in (tmp_path / "termination-log").read_text()


@pytest.mark.timeout(120)
def test_plain_single_process_and_legacy_local_rank(mp, tmp_path, trainer_env):
    """No torchrun, no WORLD_SIZE: world size 1 without a process group; torch.distributed.
    launch's --local_rank is accepted."""
    ckpt = tmp_path / "ckpt"
    proc = mp.run([*mp.pod_entry()[:1], "-m", "ddptrainer.main", *mp.TINY, "--fake-size", "32",
                   "--checkpoint-dir", str(ckpt), "--local_rank=0"], trainer_env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world_size=1 backend=none device=cpu" in proc.stdout
    assert "ddptrain: done step=4/4" in proc.stdout
    assert checkpoint.read(checkpoint.latest_checkpoint(str(ckpt)))["world_size"] == 1


@pytest.mark.timeout(240)
def test_two_ranks_skip_a_damaged_checkpoint_and_stop_for_good_when_none_loads(
        mp, tmp_path, trainer_env):
    ckpt = tmp_path / "ckpt"
    args = [*mp.TINY, "--fake-size", "64", "--checkpoint-dir", str(ckpt)]
    first = mp.run(mp.torchrun(2, *mp.trainer(*args, "--max-steps", "2",
                                              "--checkpoint-every", "1")), trainer_env)
    assert first.returncode == 0, first.stderr[-3000:]
    newest = ckpt / "step-00000002.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # cut short
    again = mp.run(mp.torchrun(2, *mp.trainer(*args, "--max-steps", "3")), trainer_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"warning: checkpoint {newest} is truncated or damaged" in again.stdout
    assert f"resumed from {ckpt / 'step-00000001.pt'} at step=1" in again.stdout
    assert (ckpt / "step-00000002.pt.corrupt").exists()

    for _step, path in checkpoint.list_checkpoints(str(ckpt)):
        with open(path, "r+b") as f:
            f.write(b"garbage!" * 8)
    broken = mp.run(mp.pod_entry(*args, "--max-steps", "4"),
                    dict(trainer_env, PET_NPROC_PER_NODE="2"))
    assert broken.returncode == ExitCode.BAD_CONFIG, broken.stderr[-3000:]
    message = (tmp_path / "termination-log").read_text()
    assert "can be loaded" in message and "step-00000003.pt" in message


def _as_job(trainer_env, name, uid):
    return dict(trainer_env, DDPJOB_NAMESPACE="team", DDPJOB_NAME=name, DDPJOB_UID=uid)


def _owners(folder):
    from ddptrainer import ownership

    return {step: ownership.read_record(path) for step, path in checkpoint.list_checkpoints(str(folder))}


@pytest.mark.timeout(400)
def test_two_jobs_in_one_folder_neither_resume_nor_prune_each_others(mp, tmp_path, trainer_env):
    """docs/trainer.md, "Whose a checkpoint is": 2 ranks x batch 8 over 64 samples, 4 steps an
    epoch, a checkpoint every 4 steps."""
    shared = tmp_path / "shared"
    args = [*mp.TINY, "--fake-size", "64", "--epochs", "10", "--checkpoint-every", "4",
            "--checkpoint-dir", str(shared)]
    job_a, job_b = _as_job(trainer_env, "a", "uid-a"), _as_job(trainer_env, "b", "uid-b")
    first = mp.run(mp.torchrun(2, *mp.trainer(*args, "--max-steps", "8")), job_a, timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p.name: p.read_bytes() for p in shared.iterdir()}

    # Another job given the same folder: refused before training, naming both, touching nothing.
    refused = mp.run(mp.torchrun(2, *mp.trainer(*args, "--max-steps", "12")), job_b, timeout=120)
    assert refused.returncode != 0 and "exitcode  : 2" in refused.stderr  # torchrun itself says 1
    assert (f"--checkpoint-dir: {shared} holds checkpoints of job team/a (uid uid-a) (newest "
            "step-00000008.pt); this is job team/b (uid uid-b)") in refused.stderr
    assert "--adopt-checkpoints" in refused.stderr
    assert {p.name: p.read_bytes() for p in shared.iterdir()} == before
    from ddptrainer.ownership import Owner

    a = Owner("team", "a", "uid-a")
    assert _owners(shared) == {4: a, 8: a}

    # Adopting on purpose takes the newest; pruning (keep 1) then deletes b's own files only.
    adopted = mp.run(mp.torchrun(2, *mp.trainer(*args, "--max-steps", "16", "--adopt-checkpoints",
                                                "--keep-checkpoints", "1")), job_b, timeout=120)
    assert adopted.returncode == 0, adopted.stderr[-3000:]
    assert "resuming from step-00000008.pt of job team/a (uid uid-a)" in adopted.stdout
    assert _owners(shared) == {4: a, 16: Owner("team", "b", "uid-b")}

    # A restart of job a resumes its own newest, not b's newer file, which it leaves alone.
    again = mp.run(mp.torchrun(2, *mp.trainer(*args, "--max-steps", "8")), job_a, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {shared / 'step-00000004.pt'} at step=4" in again.stdout
    assert "also holds 1 checkpoint(s) of other jobs" in again.stdout
    assert _owners(shared) == {4: a, 8: a, 16: Owner("team", "b", "uid-b")}
