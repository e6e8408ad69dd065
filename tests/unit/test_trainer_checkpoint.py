"""Checkpoint files: atomic, newest by step, pruned, safe to load; models without downloads."""
from __future__ import annotations

import os
import random

import pytest
import torch

from ddpjob.contract import ExitCode
from ddptrainer import checkpoint, ownership
from ddptrainer.distributed import DistContext
from ddptrainer.errors import CheckpointError, ConfigError
from ddptrainer.models import build_model
from ddptrainer.ownership import Owner

pytestmark = pytest.mark.unit

SINGLE = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"),
                     backend=None)


def test_save_then_load_latest_roundtrip(tmp_path):
    model = torch.nn.Linear(3, 2)
    for step in (5, 10, 15):
        path = checkpoint.save(SINGLE, str(tmp_path), keep=2,
                               state={"step": step, "model": model.state_dict()})
        assert path == str(tmp_path / f"step-{step:08d}.pt")
    # keep=2: the oldest went (with its owner record); no temp files are left behind
    assert sorted(os.listdir(tmp_path)) == ["step-00000010.pt", "step-00000010.pt.owner",
                                            "step-00000015.pt", "step-00000015.pt.owner"]
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
    mine, theirs = Owner("ns", "a", "uid-a"), Owner("ns", "b", "uid-b")
    for owner in (mine, theirs):
        for name in ("step-00000007.pt", "step-00000007.pt.owner"):
            with open(ownership.temp_path(str(tmp_path / name), owner), "wb") as f:
                f.write(b"half")
    untagged = tmp_path / ".step-00000007.pt.tmp-4242"  # from a version before owner tags
    untagged.write_bytes(b"half")
    checkpoint.prepare_folder(SINGLE, str(tmp_path), mine)
    # this job's are gone; another job's may be being written right now: left alone
    left = sorted(os.listdir(tmp_path))
    assert len(left) == 3 and untagged.name in left
    assert all(theirs.tag() in name for name in left if name != untagged.name)


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


# --- whose a checkpoint is (docs/trainer.md, "Whose a checkpoint is") ------------------------
JOB_A = Owner("team", "resnet-a", "uid-a")
JOB_B = Owner("team", "resnet-b", "uid-b")


def _save(folder, step, owner, keep=10):
    return checkpoint.save(SINGLE, str(folder), keep, {"step": step, "x": torch.ones(1)},
                           owner=owner)


def _files(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_a_checkpoint_records_its_owner_beside_it_and_inside_it(tmp_path):
    path = _save(tmp_path, 3, JOB_A)
    assert ownership.read_record(path) == JOB_A
    assert checkpoint.read(path)["owner"] == {"namespace": "team", "name": "resnet-a",
                                              "uid": "uid-a"}


def test_a_folder_of_another_jobs_checkpoints_is_refused_naming_both(tmp_path):
    _save(tmp_path, 4, JOB_A)
    _save(tmp_path, 8, JOB_A)
    before = _files(tmp_path)
    problem, newest = checkpoint.prepare_folder(SINGLE, str(tmp_path), JOB_B)
    assert newest is None
    assert f"{tmp_path} holds checkpoints of job team/resnet-a (uid uid-a)" in problem
    assert "(newest step-00000008.pt)" in problem and "this is job team/resnet-b (uid uid-b)" in problem
    assert "--adopt-checkpoints" in problem and "its own folder" in problem
    with pytest.raises(ConfigError, match="holds checkpoints of job team/resnet-a"):
        checkpoint.find_resumable(SINGLE, str(tmp_path), JOB_B)
    assert _files(tmp_path) == before  # nothing read into, renamed or deleted


def test_a_restart_of_the_same_job_resumes_its_own_even_next_to_newer_foreign_ones(tmp_path):
    _save(tmp_path, 2, JOB_A)
    _save(tmp_path, 50, JOB_B)  # both jobs were started on the folder at once
    problem, newest = checkpoint.prepare_folder(SINGLE, str(tmp_path), JOB_A)
    assert problem is None and newest.endswith("step-00000002.pt")
    found = checkpoint.find_resumable(SINGLE, str(tmp_path), JOB_A)
    assert found.path.endswith("step-00000002.pt") and found.state["step"] == 2
    assert any("also holds 1 checkpoint(s) of other jobs" in n and "resnet-b" in n
               for n in found.notes)
    assert ownership.read_record(str(tmp_path / "step-00000050.pt")) == JOB_B  # still B's


def test_a_recreated_namesake_is_another_job_unless_it_adopts_on_purpose(tmp_path):
    _save(tmp_path, 6, JOB_A)
    again = Owner("team", "resnet-a", "uid-a-2")  # deleted and created again: a new uid
    problem, _ = checkpoint.prepare_folder(SINGLE, str(tmp_path), again)
    assert "job team/resnet-a (uid uid-a)" in problem and "(uid uid-a-2)" in problem
    problem, newest = checkpoint.prepare_folder(SINGLE, str(tmp_path), again, adopt=True)
    assert problem is None and newest.endswith("step-00000006.pt")
    found = checkpoint.find_resumable(SINGLE, str(tmp_path), again, adopt=True)
    assert found.state["step"] == 6
    assert any("of job team/resnet-a (uid uid-a) (--adopt-checkpoints); it is this job's from "
               "now on" in n for n in found.notes)
    # adopted: a restart without the flag resumes it as its own, and pruning treats it so
    assert ownership.read_record(found.path) == again
    assert checkpoint.prepare_folder(SINGLE, str(tmp_path), again)[1] == found.path


def test_a_record_without_uid_is_the_namesakes_own(tmp_path):
    """Written under an operator that did not set DDPJOB_UID yet: the same job, upgraded."""
    _save(tmp_path, 5, Owner("team", "resnet-a", ""))
    assert checkpoint.prepare_folder(SINGLE, str(tmp_path), JOB_A) == (
        None, str(tmp_path / "step-00000005.pt"))
    assert checkpoint.prepare_folder(SINGLE, str(tmp_path), JOB_B)[1] is None


def test_checkpoints_from_before_ownership_resume_with_a_warning_and_become_the_jobs(tmp_path):
    checkpoint.write_atomic({"format": 2, "step": 1}, str(tmp_path / "step-00000001.pt"))
    checkpoint.write_atomic({"format": 2, "step": 2}, str(tmp_path / "step-00000002.pt"))
    assert not (tmp_path / "step-00000002.pt.owner").exists()
    found = checkpoint.find_resumable(SINGLE, str(tmp_path), JOB_A)
    assert found.path.endswith("step-00000002.pt")
    assert any(n.startswith(f"warning: checkpoint {found.path} records no owner") for n in found.notes)
    assert ownership.read_record(found.path) == JOB_A
    # the older unrecorded one may be another job's from before records: never pruned
    _save(tmp_path, 3, JOB_A, keep=1)
    assert sorted(s for s, _ in checkpoint.list_checkpoints(str(tmp_path))) == [1, 3]


def test_a_checkpoint_copied_without_its_record_still_says_whose_it_is(tmp_path):
    source = _save(tmp_path / "a", 7, JOB_A)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "step-00000007.pt").write_bytes(open(source, "rb").read())
    with pytest.raises(ConfigError, match=r"holds checkpoints of job team/resnet-a \(uid uid-a\)"):
        checkpoint.find_resumable(SINGLE, str(tmp_path / "b"), JOB_B)
    assert not (tmp_path / "b" / "step-00000007.pt.owner").exists()
    found = checkpoint.find_resumable(SINGLE, str(tmp_path / "b"), JOB_B, adopt=True)
    assert found.state["step"] == 7 and ownership.read_record(found.path) == JOB_B


def test_pruning_deletes_only_the_jobs_own_files(tmp_path):
    _save(tmp_path, 1, JOB_A)
    _save(tmp_path, 2, JOB_A)
    checkpoint.write_atomic({"format": 2, "step": 3}, str(tmp_path / "step-00000003.pt"))
    for step in (4, 5, 6):
        _save(tmp_path, step, JOB_B, keep=1)
    by_owner = {step: ownership.read_record(path)
                for step, path in checkpoint.list_checkpoints(str(tmp_path))}
    assert by_owner == {1: JOB_A, 2: JOB_A, 3: None, 6: JOB_B}
    assert not (tmp_path / "step-00000004.pt.owner").exists()  # B's records went with its files


def test_a_save_never_replaces_another_jobs_file_of_the_same_step(tmp_path):
    path = _save(tmp_path, 3, JOB_A)
    before = _files(tmp_path)
    with pytest.raises(ConfigError, match=r"step-00000003.pt already exists and belongs to job "
                                          r"team/resnet-a \(uid uid-a\); this is job team/resnet-b"):
        _save(tmp_path, 3, JOB_B)
    assert _files(tmp_path) == before
    writer = checkpoint.BackgroundWriter()  # the background writer reports it the same way
    checkpoint.save(SINGLE, str(tmp_path), 2, {"step": 3}, writer, blocking=False, owner=JOB_B)
    with pytest.raises(ConfigError, match="another job writes checkpoints"):
        checkpoint.flush(SINGLE, writer)
    assert ownership.read_record(path) == JOB_A


def _plant(record, how):
    if how == "huge":
        record.write_bytes(b'{"name": "' + b"x" * (1 << 20) + b'"}')
    elif how == "not json":
        record.write_bytes(b"\xff\xfe garbage")
    elif how == "a list":
        record.write_text('["team", "resnet-a"]')
    elif how == "deep":
        record.write_text("[" * 3000 + "]" * 3000)
    elif how == "a number field":
        record.write_text('{"namespace": "team", "name": 7, "uid": "u"}')
    elif how == "long field":
        record.write_text('{"namespace": "team", "name": "%s", "uid": "u"}' % ("n" * 300))
    elif how == "fifo":
        os.mkfifo(record)  # opened for reading, it would block the start forever
    elif how == "symlink":
        record.symlink_to("/dev/zero")
    elif how == "folder":
        record.mkdir()


@pytest.mark.parametrize("how", ["huge", "not json", "a list", "deep", "a number field",
                                 "long field", "fifo", "symlink", "folder"])
def test_a_hostile_owner_record_is_an_unknown_owner_never_a_crash(tmp_path, how):
    checkpoint.write_atomic({"format": 2, "step": 9}, str(tmp_path / "step-00000009.pt"))
    _plant(tmp_path / "step-00000009.pt.owner", how)
    recorded = ownership.read_record(str(tmp_path / "step-00000009.pt"))
    assert isinstance(recorded, ownership.Unknown)
    problem, newest = checkpoint.prepare_folder(SINGLE, str(tmp_path), JOB_A)
    assert newest is None and "holds checkpoints of an unknown job (step-00000009.pt.owner" in problem
    _save(tmp_path, 10, JOB_A, keep=1)
    _save(tmp_path, 11, JOB_A, keep=1)
    assert (tmp_path / "step-00000009.pt").exists()  # not the job's: never pruned


def test_the_jobs_identity_comes_from_the_pod_contract():
    env = {"DDPJOB_NAMESPACE": "team", "DDPJOB_NAME": "resnet-a", "DDPJOB_UID": "uid-a"}
    assert ownership.from_environment(env) == JOB_A
    assert ownership.from_environment({}) == Owner()
    assert Owner().describe() == "a ddptrain run outside any DDPJob (no DDPJOB_NAME)"
    with pytest.raises(ConfigError, match="DDPJOB_UID is 300 characters long"):
        ownership.from_environment({**env, "DDPJOB_UID": "u" * 300})


def test_a_run_of_another_job_in_the_same_folder_exits_2_naming_both(tmp_path, capsys):
    from ddptrainer import main

    def run(name, uid, *argv):
        environ = {"DDPJOB_TERMINATION_LOG": str(tmp_path / "term"), "DDPJOB_NAMESPACE": "team",
                   "DDPJOB_NAME": name, "DDPJOB_UID": uid}
        return main.run([*TINY_RUN, "--checkpoint-dir", str(tmp_path / "ckpt"), *argv],
                        environ=environ)

    assert run("resnet-a", "uid-a", "--max-steps", "2") == 0
    before = _files(tmp_path / "ckpt")
    capsys.readouterr()
    assert run("resnet-b", "uid-b", "--max-steps", "3") == ExitCode.BAD_CONFIG
    err = capsys.readouterr().err
    assert (f"ddptrain: error: --checkpoint-dir: {tmp_path / 'ckpt'} holds checkpoints of job "
            "team/resnet-a (uid uid-a)") in err and "this is job team/resnet-b (uid uid-b)" in err
    assert _files(tmp_path / "ckpt") == before
    assert run("resnet-a", "uid-a", "--max-steps", "3") == 0  # job a's restart resumes
    assert "resumed from" in capsys.readouterr().out
