"""Checkpoint files: atomic, newest by step, pruned, safe to load; models without downloads."""
from __future__ import annotations

import os
import random

import pytest
import torch

from ddpjob.contract import ExitCode
from ddptrainer import checkpoint
from ddptrainer.distributed import DistContext
from ddptrainer.errors import CheckpointError, ConfigError
from ddptrainer.models import build_model

pytestmark = pytest.mark.unit

SINGLE = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"),
                     backend=None)


def test_save_then_load_latest_roundtrip(tmp_path):
    model = torch.nn.Linear(3, 2)
    for step in (5, 10, 15):
        path = checkpoint.save(SINGLE, str(tmp_path), keep=2,
                               state={"step": step, "model": model.state_dict()})
        assert path == str(tmp_path / f"step-{step:08d}.pt")
    # keep=2: the oldest went; no temp files are left behind
    assert sorted(os.listdir(tmp_path)) == ["step-00000010.pt", "step-00000015.pt"]
    problem, path = checkpoint.prepare_folder(SINGLE, str(tmp_path))
    assert problem is None and path.endswith("step-00000015.pt")
    state = checkpoint.load(SINGLE, path)
    assert state["step"] == 15
    assert state["world_size"] == 1 and len(state["rng"]) == 1
    torch.testing.assert_close(state["model"]["weight"], model.weight.detach())


def test_no_checkpoint_means_none(tmp_path):
    assert checkpoint.prepare_folder(SINGLE, str(tmp_path / "absent")) == (None, None)
    assert (tmp_path / "absent").is_dir()


def test_half_written_temp_files_are_never_picked(tmp_path):
    checkpoint.write_atomic({"format": 1, "step": 3}, str(tmp_path / "step-00000003.pt"))
    (tmp_path / ".step-00000009.pt.tmp-123").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("x")
    assert checkpoint.latest_checkpoint(str(tmp_path)).endswith("step-00000003.pt")
    # numeric order, not text order, past eight digits
    checkpoint.write_atomic({"format": 1}, str(tmp_path / "step-100000000.pt"))
    assert checkpoint.latest_checkpoint(str(tmp_path)).endswith("step-100000000.pt")


def test_foreign_file_is_refused(tmp_path):
    path = tmp_path / "step-00000001.pt"
    torch.save({"something": "else"}, path)
    with pytest.raises(CheckpointError, match="not a ddptrain checkpoint"):
        checkpoint.read(str(path))


def test_rng_state_roundtrip():
    state = checkpoint.capture_rng(torch.device("cpu"))
    a = (torch.rand(3), random.random())
    checkpoint.restore_rng(state, torch.device("cpu"))
    b = (torch.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_write_failure_is_a_checkpoint_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="writing"):
        checkpoint.save(SINGLE, str(blocker / "ckpt"), keep=1, state={"step": 1})


@pytest.mark.parametrize("name", ["tiny-cnn", "resnet18", "resnet50"])
@pytest.mark.parametrize("channels", [1, 3])
def test_models_follow_the_data(name, channels):
    model, notes = build_model(name, channels, 7)
    out = model(torch.randn(2, channels, 32, 32))
    assert out.shape == (2, 7) and notes == []


def test_local_weights_load_where_shapes_fit(tmp_path):
    source, _ = build_model("resnet18", 3, 1000)
    path = tmp_path / "imagenet.pt"
    torch.save(source.state_dict(), path)
    model, notes = build_model("resnet18", 1, 10, weights=str(path))  # MNIST-shaped
    assert torch.equal(model.layer1[0].conv1.weight, source.layer1[0].conv1.weight)
    assert not torch.equal(model.fc.weight[:1], source.fc.weight[:1, :512])
    assert "kept initial values" in notes[1] and "conv1.weight" in notes[1]


def test_missing_weights_file_is_bad_config(tmp_path):
    with pytest.raises(ConfigError, match="^--weights: .* is not a file"):
        build_model("tiny-cnn", 3, 10, weights=str(tmp_path / "none.pt"))


def test_unusable_checkpoint_folder_is_found_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    problem, newest = checkpoint.prepare_folder(SINGLE, str(blocker / "sub"))
    assert "cannot be created" in problem and newest is None


def test_unreadable_checkpoint_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "step-00000002.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="rank 0: reading"):
        checkpoint.load(SINGLE, str(path))


TINY_RUN = ["--model", "tiny-cnn", "--image-size", "8", "--fake-size", "16", "--batch-size", "4",
            "--num-workers", "0", "--log-every", "2"]


def _run(tmp_path, *argv):
    from ddptrainer import main

    return main.run([*TINY_RUN, "--checkpoint-dir", str(tmp_path / "ckpt"), *argv],
                    environ={"DDPJOB_TERMINATION_LOG": str(tmp_path / "term")})


def test_single_process_run_resumes_and_refuses_what_it_cannot(tmp_path, capsys):
    assert _run(tmp_path, "--max-steps", "2") == 0
    assert _run(tmp_path, "--max-steps", "3") == 0  # resumes at 2, one more step
    out = capsys.readouterr().out
    assert "resumed from" in out and "ddptrain: done step=3/3" in out
    assert "completed: step=3/3" in (tmp_path / "term").read_text()
    # starting over next to the old files would resume the wrong run later: refused
    assert _run(tmp_path, "--no-resume") == 2
    assert "ddptrain: error: --no-resume: " in capsys.readouterr().err
    # a checkpoint of another model cannot be resumed: refused, with the difference named
    assert _run(tmp_path, "--model", "resnet18") == 2
    err = capsys.readouterr().err
    assert "--checkpoint-dir:" in err and "model 'tiny-cnn' (now 'resnet18')" in err


def test_background_save_snapshots_then_writes(tmp_path):
    model = torch.nn.Linear(3, 2)
    writer = checkpoint.BackgroundWriter()
    before = model.weight.detach().clone()
    checkpoint.save(SINGLE, str(tmp_path), 2, {"step": 1, "model": model.state_dict()},
                    writer, blocking=False)
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on while the file is written
    checkpoint.flush(SINGLE, writer)
    saved = checkpoint.read(str(tmp_path / "step-00000001.pt"))
    assert torch.equal(saved["model"]["weight"], before)  # the state at save time


def test_background_write_failure_is_reported_by_the_next_save(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    writer = checkpoint.BackgroundWriter()
    checkpoint.save(SINGLE, str(blocker / "ckpt"), 1, {"step": 1}, writer, blocking=False)
    with pytest.raises(CheckpointError, match="step-00000001.pt failed"):
        checkpoint.save(SINGLE, str(tmp_path / "ok"), 1, {"step": 2}, writer, blocking=False)


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path):
    (tmp_path / ".step-00000007.pt.tmp-4242").write_bytes(b"half")
    checkpoint.prepare_folder(SINGLE, str(tmp_path))
    assert os.listdir(tmp_path) == []


def _damage(path, how):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\x00garbage" * 64)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path, capsys, how):
    assert _run(tmp_path, "--max-steps", "2", "--checkpoint-every", "1") == 0
    ckpt = tmp_path / "ckpt"
    newest = ckpt / "step-00000002.pt"
    _damage(newest, how)
    capsys.readouterr()
    assert _run(tmp_path, "--max-steps", "3") == 0
    out = capsys.readouterr().out
    assert f"ddptrain: warning: checkpoint {newest} is " in out
    assert "renamed to step-00000002.pt.corrupt" in out
    assert f"resumed from {ckpt / 'step-00000001.pt'} at step=1" in out
    assert "ddptrain: done step=3/3" in out
    # set aside for inspection, never picked again
    assert (ckpt / "step-00000002.pt.corrupt").exists()
    assert [s for s, _ in checkpoint.list_checkpoints(str(ckpt))] == [1, 3]


def test_a_checkpoint_that_can_never_load_is_permanent(tmp_path, capsys):
    assert _run(tmp_path, "--max-steps", "2") == 0
    only = tmp_path / "ckpt" / "step-00000002.pt"
    _damage(only, "truncated")
    capsys.readouterr()
    for _attempt in range(2):  # a restart reads the same bytes: the same answer, exit 2
        assert _run(tmp_path, "--max-steps", "3") == ExitCode.BAD_CONFIG
        err = capsys.readouterr().err
        assert f"no checkpoint in {tmp_path / 'ckpt'} can be loaded: {only} (truncated" in err
        assert "Move the damaged files away" in err
        assert only.exists()  # left where it is: the user decides
    assert "bad configuration: --checkpoint-dir:" in (tmp_path / "term").read_text()


def test_a_read_error_of_the_volume_stays_retryable(tmp_path, monkeypatch):
    checkpoint.write_atomic({"format": 2, "step": 1}, str(tmp_path / "step-00000001.pt"))

    def flaky(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoint, "read", flaky)
    monkeypatch.setattr(checkpoint, "open", flaky, raising=False)  # the volume's, not the file's
    with pytest.raises(CheckpointError, match="Input/output error"):
        checkpoint.find_resumable(SINGLE, str(tmp_path))
    assert (tmp_path / "step-00000001.pt").exists()


def test_an_old_format_1_checkpoint_still_resumes(tmp_path, capsys):
    assert _run(tmp_path, "--max-steps", "2") == 0  # 16 samples, batch 4: mid-epoch at 2
    path = tmp_path / "ckpt" / "step-00000002.pt"
    state = torch.load(path, weights_only=True)
    state["format"], state["batch_in_epoch"] = 1, 2
    del state["samples_in_epoch"]
    torch.save(state, path)
    capsys.readouterr()
    assert _run(tmp_path, "--epochs", "1") == 0
    out = capsys.readouterr().out
    assert "at step=2 (epoch 1, 8/16 samples done" in out and "done step=4/4" in out


def test_torchs_writer_error_is_disk_full_only_when_the_volume_is():
    from ddptrainer import disk_full

    err = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    mib = disk_full.MIB
    assert disk_full.is_disk_full(err, needed=10 * mib, free_before=mib, free_after=0)
    assert disk_full.is_disk_full(err, needed=mib, free_before=100 * mib, free_after=0)
    assert not disk_full.is_disk_full(err, needed=mib, free_before=100 * mib,
                                      free_after=99 * mib)
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = OSError(28, "No space left on device")
    assert disk_full.is_disk_full(wrapped, mib, None, None)
    assert not disk_full.is_disk_full(OSError(5, "Input/output error"), mib, None, None)
