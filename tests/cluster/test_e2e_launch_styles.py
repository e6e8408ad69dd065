"""End-to-end: the four launch styles of scripts people already have (docs/launch-styles.md),
each example applied unchanged with kubectl, its script shipped in a ConfigMap."""
from __future__ import annotations

import copy

import pytest
import yaml

from ddpjob import contract

from .e2e_support import EXAMPLES, e2e  # noqa: F401 - e2e is a fixture

pytestmark = pytest.mark.cluster
TRAINING_TIMEOUT = 300  # seconds: 2 pods x 2 processes on 2 shared cores


def example_documents(name: str) -> list[dict]:
    return list(yaml.safe_load_all((EXAMPLES / name).read_text()))


@pytest.mark.kubelet
def test_style1_local_rank_script_runs_unmodified(e2e, kubectl):
    """argparse --local_rank without a default, 2 nodes x 2 processes, localRankFlag."""
    kubectl("apply", "-n", e2e.namespace, "-f", str(EXAMPLES / "ddpjob-launch-local-rank.yaml"))
    status = e2e.wait_until_finished("launch-local-rank", TRAINING_TIMEOUT)
    assert (status["phase"], status["restarts"]) == ("Succeeded", 0), status
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        log = e2e.wait_for_logs(f"launch-local-rank-node-{node}", "local_rank 1 ok")
        for local, rank in enumerate(ranks):
            assert f"rank {rank}/4 local_rank {local} ok" in log, log


def test_style2_mp_spawn_runs_on_one_node_and_is_refused_with_the_fix_on_two(e2e, kubectl):
    """The mp.spawn script unchanged: a single-node job succeeds; as a 2-node job the init guard
    fails it at once (exit 2, no restart), the message showing the lines to change."""
    kubectl("apply", "-n", e2e.namespace, "-f", str(EXAMPLES / "ddpjob-mp-spawn.yaml"))
    status = e2e.wait_until_finished("mp-spawn", TRAINING_TIMEOUT)
    assert (status["phase"], status["restarts"]) == ("Succeeded", 0), status
    log = e2e.wait_for_logs("mp-spawn-node-0", "rank 1/2 ok")
    assert "rank 0/2 ok: 32 samples here, 64 in all" in log, log

    job = copy.deepcopy(example_documents("ddpjob-mp-spawn.yaml")[-1])
    job["metadata"]["name"] = "mp-spawn-two-nodes"
    job["spec"].update(nnodes=2, failurePolicy={"maxRestarts": 3})
    e2e.create(job)
    status = e2e.wait_until_finished("mp-spawn-two-nodes", TRAINING_TIMEOUT)
    assert (status["phase"], status["reason"], status["restarts"]) == ("Failed", "PodFailedPermanent", 0), status
    failed = status["failedNode"]
    assert failed["exitCode"] == int(contract.ExitCode.BAD_CONFIG), failed
    assert "would not join the 2-node job's world" in failed["message"], failed
    assert 'os.environ["MASTER_ADDR"] = "localhost"   -> delete' in failed["message"], failed
    for node in range(2):
        assert "ok:" not in e2e.logs(f"mp-spawn-two-nodes-node-{node}"), "a pod trained alone"


def test_style3_env_script_refused_as_a_command_and_coherent_through_the_pod_entry(e2e, kubectl):
    """The PyTorchJob-MNIST-style script: as `command` with nprocPerNode 2 the API server refuses
    it (as `ddpjob validate` does); through the pod entry point every process gets its rank."""
    documents = example_documents("ddpjob-env-script.yaml")
    refused = copy.deepcopy(documents)
    refused[-1]["spec"].pop("args")
    refused[-1]["spec"]["command"] = ["python", "/workspace/env_mnist_style.py"]
    result = kubectl("apply", "-n", e2e.namespace, "-f", "-", input=yaml.safe_dump_all(refused), check=False)
    assert result.returncode != 0, result.stdout
    assert "spec.command" in result.stderr and "a command of your own runs once per pod" in result.stderr, result.stderr
    assert e2e.job("env-script") is None

    kubectl("apply", "-n", e2e.namespace, "-f", str(EXAMPLES / "ddpjob-env-script.yaml"))
    succeeds_with_four_ranks(e2e, "env-script")


def succeeds_with_four_ranks(e2e, name: str) -> None:
    """The job Succeeds without a restart, and its 2 pods x 2 processes are ranks 0..3 of one world."""
    status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
    assert (status["phase"], status["restarts"]) == ("Succeeded", 0), status
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        log = e2e.wait_for_logs(f"{name}-node-{node}", f"rank {ranks[1]}/4 ok")
        assert f"rank {ranks[0]}/4 ok" in log, log


@pytest.mark.kubelet
def test_torchrun_command_with_two_processes_per_pod_gives_a_coherent_world(e2e, kubectl):
    """A PyTorchJob user's `command: [torchrun, SCRIPT]` with nprocPerNode 2, applied with kubectl:
    accepted (torchrun starts the processes), and torchrun's rendezvous comes from the pod's
    PET_* variables: 2 pods x 2 processes, ranks 0..3 of one world."""
    documents = example_documents("ddpjob-env-script.yaml")
    documents[-1]["metadata"]["name"] = "torchrun-command"
    documents[-1]["spec"].update(command=["torchrun", "/workspace/env_mnist_style.py"], args=["--epochs", "1"])
    kubectl("apply", "-n", e2e.namespace, "-f", "-", input=yaml.safe_dump_all(documents))
    succeeds_with_four_ranks(e2e, "torchrun-command")


def test_style4_imagenet_script_runs_unmodified(e2e, kubectl):
    """pytorch/examples' imagenet skeleton: --dist-url tcp://$(MASTER_ADDR):$(MASTER_PORT),
    --world-size $(NNODES), --rank $(PET_NODE_RANK), mp.spawn inside, launcher: spawn."""
    kubectl("apply", "-n", e2e.namespace, "-f", str(EXAMPLES / "ddpjob-imagenet-style.yaml"))
    status = e2e.wait_until_finished("imagenet-style", TRAINING_TIMEOUT)
    assert (status["phase"], status["restarts"]) == ("Succeeded", 0), status
    for node in range(2):
        log = e2e.wait_for_logs(f"imagenet-style-node-{node}", f"rank {node}/2 ok")
        assert f"rank {node}/2 ok: 64 samples here" in log, log
