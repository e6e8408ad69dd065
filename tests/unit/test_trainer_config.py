"""The trainer's config: every validated flag gets one clear line and exit code 2."""
from __future__ import annotations

import pytest

from ddpjob.contract import ExitCode
from ddptrainer import main
from ddptrainer.config import TrainConfig, parse_config
from ddptrainer.errors import ConfigError

pytestmark = pytest.mark.unit

# (argv, the flag the message must start with, a word the message must contain)
BAD = [
    (["--model", "vgg"], "--model", "invalid choice"),
    (["--dataset", "imagenet"], "--dataset", "invalid choice"),
    (["--optimizer", "lbfgs"], "--optimizer", "invalid choice"),
    (["--device", "tpu"], "--device", "auto, cpu, gpu"),
    (["--backend", "mpi"], "--backend", "invalid choice"),
    (["--precision", "fp16"], "--precision", "invalid choice"),
    (["--log-format", "xml"], "--log-format", "invalid choice"),
    (["--fake-size", "0"], "--fake-size", ">= 1"),
    (["--image-size", "4"], "--image-size", "from 8 to 1024"),
    (["--num-classes", "1"], "--num-classes", "from 2 to 100000"),
    (["--batch-size", "0"], "--batch-size", "from 1 to 65536"),
    (["--batch-size", "many"], "--batch-size", "must be an integer"),
    (["--epochs", "0"], "--epochs", ">= 1"),
    (["--max-steps", "-1"], "--max-steps", ">= 0"),
    (["--lr", "0"], "--lr", "> 0"),
    (["--lr", "nan"], "--lr", "finite"),
    (["--lr", "fast"], "--lr", "must be a number"),
    (["--momentum", "1"], "--momentum", "< 1"),
    (["--weight-decay", "-0.1"], "--weight-decay", ">= 0"),
    (["--seed", "-1"], "--seed", "from 0"),
    (["--num-workers", "-1"], "--num-workers", "from 0 to 256"),
    (["--cpu-threads", "-1"], "--cpu-threads", "from 0 to 1024"),
    (["--checkpoint-every", "-1"], "--checkpoint-every", ">= 0"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints", "from 1 to 1000"),
    (["--log-every", "0"], "--log-every", ">= 1"),
    (["--collective-timeout-seconds", "0"], "--collective-timeout-seconds", "from 1 to 86400"),
    (["--local_rank", "-1"], "--local-rank", "from 0 to 1023"),
    (["--data-dir", ""], "--data-dir", "not empty"),
    (["--checkpoint-dir", ""], "--checkpoint-dir", "not empty"),
    (["--device", "cpu", "--backend", "nccl"], "--backend", "nccl needs --device gpu"),
    (["--dataset", "mnist", "--image-size", "28"], "--image-size", "only for --dataset fake"),
    (["--dataset", "cifar10", "--fake-size", "9"], "--fake-size", "only for --dataset fake"),
    (["--dataset", "mnist", "--num-classes", "3"], "--num-classes", "only for --dataset fake"),
    (["--dataset", "mnist", "--fake-signal", "0.5"], "--fake-signal", "only for --dataset fake"),
    (["--fake-signal", "1.5"], "--fake-signal", "1"),
    (["--fake-signal", "-0.1"], "--fake-signal", "0"),
    (["--eval-every", "-1"], "--eval-every", ">= 0"),
    (["--no-such-flag"], "unrecognized arguments", "--no-such-flag"),
]


@pytest.mark.parametrize("argv,flag,words", BAD, ids=[" ".join(b[0]) or "empty" for b in BAD])
def test_every_bad_flag_names_itself(argv, flag, words):
    with pytest.raises(ConfigError) as err:
        parse_config(argv, environ={})
    assert err.value.message.startswith(flag), err.value.message
    assert words in err.value.message
    assert err.value.exit_code == ExitCode.BAD_CONFIG


@pytest.mark.parametrize("argv,flag,words", BAD[:3] + BAD[8:16], ids=lambda v: str(v))
def test_bad_flag_is_one_stderr_line_and_exit_2(argv, flag, words, capsys, tmp_path):
    code = main.run(argv, environ={"DDPJOB_TERMINATION_LOG": str(tmp_path / "term")})
    err = capsys.readouterr().err
    assert code == ExitCode.BAD_CONFIG
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"ddptrain: error: {flag}")
    assert (tmp_path / "term").read_text().startswith(f"ddptrain: bad configuration: {flag}")


def test_device_from_the_operators_environment():
    assert parse_config([], environ={"DDPJOB_DEVICE": "gpu"}).device == "gpu"
    assert parse_config([], environ={"DDPJOB_DEVICE": "cpu"}).device == "cpu"
    assert parse_config(["--device", "cpu"], environ={"DDPJOB_DEVICE": "gpu"}).device == "cpu"
    assert parse_config(["--device", "cuda"], environ={}).device == "gpu"
    with pytest.raises(ConfigError, match=r"^--device: DDPJOB_DEVICE='tpu'"):
        parse_config([], environ={"DDPJOB_DEVICE": "tpu"})


def test_folders_and_termination_log_from_environment_flags_win():
    env = {"DDPTRAINER_DATA_DIR": "/data", "DDPTRAINER_CHECKPOINT_DIR": "/ckpt",
           "DDPJOB_TERMINATION_LOG": "/tmp/t"}
    c = parse_config([], environ=env)
    assert (c.data_dir, c.checkpoint_dir, c.termination_log) == ("/data", "/ckpt", "/tmp/t")
    c = parse_config(["--data-dir", "d", "--checkpoint-dir", "c", "--termination-log", "t"],
                     environ=env)
    assert (c.data_dir, c.checkpoint_dir, c.termination_log) == ("d", "c", "t")


def test_the_checkpoint_owner_is_the_job_of_the_environment():
    env = {"DDPJOB_NAMESPACE": "ml", "DDPJOB_NAME": "train", "DDPJOB_UID": "u-1"}
    c = parse_config([], environ=env)
    assert (c.owner.namespace, c.owner.name, c.owner.uid) == ("ml", "train", "u-1")
    assert not c.adopt_checkpoints and parse_config(["--adopt-checkpoints"], environ={}).adopt_checkpoints
    assert parse_config([], environ={}).owner.name == ""


def test_defaults_and_frozen():
    c = parse_config([], environ={})
    assert c == TrainConfig(data_dir="./data", checkpoint_dir="./checkpoints")
    with pytest.raises(Exception):
        c.lr = 1.0  # type: ignore[misc]


def test_legacy_local_rank_spellings():
    assert parse_config(["--local_rank=3"], environ={}).local_rank == 3
    assert parse_config(["--local-rank", "2"], environ={}).local_rank == 2


def test_direct_construction_is_validated_too():
    with pytest.raises(ConfigError, match="^--lr"):
        TrainConfig(lr=-1.0)
    with pytest.raises(ConfigError, match="^--epochs"):
        TrainConfig(epochs=True)  # a bool is not an epoch count


def test_channels_last_and_compile_flags():
    default = parse_config([])
    assert default.channels_last is None and default.compile is False  # None: the trainer's default
    assert parse_config(["--no-channels-last"]).channels_last is False
    assert parse_config(["--channels-last", "--compile"]) == TrainConfig(channels_last=True, compile=True)


@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_a_rank_without_a_gpu_of_its_own_says_so_whatever_its_local_rank(local_rank, capsys, tmp_path, monkeypatch):
    """Only the ranks beyond the node's GPUs hit it: local rank 0 may have a GPU and never say
    it, so the rank that hits it prints it (a silent exit 2 left the user nothing; found by
    the GPU test on one GPU, LOCAL_RANK 1)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(local_rank))
    env = {"DDPJOB_TERMINATION_LOG": str(tmp_path / "term"), "RANK": "3", "WORLD_SIZE": "4",
           "LOCAL_RANK": local_rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    code = main.run(["--device", "gpu"], environ=env)
    err = capsys.readouterr().err
    assert code == ExitCode.BAD_CONFIG
    assert err.strip() == (f"ddptrain: error: rank 3: --device: LOCAL_RANK {local_rank} has no GPU: "
                           f"{local_rank} visible (one GPU per process: nprocPerNode must not exceed "
                           "the GPUs per node)"), err


def test_fake_signal_makes_the_label_a_function_of_the_image():
    """--fake-signal (issue 36: the example's loss went from 2.31 to 2.29, chance level): the
    images of one class share its colour, so the mean colour tells the class apart."""
    import torch

    from ddptrainer.config import parse_config
    from ddptrainer.data import ClassTinted, _build

    plain = _build(parse_config(["--fake-size", "200", "--image-size", "8"]), download=False)
    tinted = _build(parse_config(["--fake-size", "200", "--image-size", "8", "--fake-signal", "0.5"]), download=False)
    assert not isinstance(plain, ClassTinted) and isinstance(tinted, ClassTinted) and len(tinted) == 200
    image, target = tinted[3]
    assert torch.allclose(image - plain[3][0], tinted.tints[target].expand_as(image), atol=1e-6) and target == plain[3][1]
    # nearest class colour from the mean colour: far better than chance (10%)
    hits = 0
    for index in range(200):
        image, target = tinted[index]
        colour = image.mean(dim=(1, 2)) - 0.5
        hits += int(torch.argmin(((tinted.tints.view(-1, 3) - colour) ** 2).sum(1))) == target
    assert hits > 100
