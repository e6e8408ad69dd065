"""The four launch styles of scripts people already have, on real gloo ranks, through
`ddpjob run` (the same environment and commands as the pods): docs/launch-styles.md.

The scripts are examples/scripts/*.py, written the way their authors write them: argparse
--local_rank without a default (torch.distributed.launch), mp.spawn with MASTER_ADDR=localhost
and a probed port, a PyTorchJob-MNIST-style env:// script reading only WORLD_SIZE/RANK.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def ddpjob(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`ddpjob ARGV`; on a timeout its nodes (each in a process group of its own) are stopped
    too, so that a hang fails the test without leaving processes behind."""
    import os
    import signal

    command = [sys.executable, "-m", "ddpjob.cli", *argv]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)  # `ddpjob run` stops its nodes on Ctrl-C
        try:
            process.communicate(timeout=30)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def changed_example(tmp_path: Path, name: str, **spec) -> Path:
    """examples/<name>, its DDPJob's spec updated with ``spec`` (None deletes a field)."""
    documents = list(yaml.safe_load_all((EXAMPLES / name).read_text()))
    job = documents[-1]["spec"]
    for key, value in spec.items():
        if value is None:
            job.pop(key, None)
        else:
            job[key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents))
    return path


# -- style 1: torch.distributed.launch era --------------------------------------------------
def test_style1_local_rank_script_runs_unmodified_with_two_processes_per_node():
    result = ddpjob("run", "-f", str(EXAMPLES / "ddpjob-launch-local-rank.yaml"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # (no "[node-N]" prefix: two processes of one node share its output, lines may interleave)
    for rank, local in ((0, 0), (1, 1), (2, 0), (3, 1)):
        assert f"rank {rank}/4 local_rank {local} ok" in result.stdout, result.stdout


def test_style1_dashed_flag_for_torch2_scripts(tmp_path):
    script = tmp_path / "dashed.py"
    script.write_text(textwrap.dedent('''
        import argparse, os
        parser = argparse.ArgumentParser()
        parser.add_argument("--local-rank", type=int)   # what torch >= 2.0 launchers pass
        parser.add_argument("--tag")
        args = parser.parse_args()
        assert args.local_rank == int(os.environ["LOCAL_RANK"]), args
        # One string, one write: two ranks share the pod's stdout (unbuffered), and print()
        # with several arguments writes each piece separately, so lines could interleave.
        print(f"local-rank {args.local_rank} tag {args.tag} ok", flush=True)
    '''))
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({
        "apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "dashed"},
        "spec": {"nnodes": 1, "nprocPerNode": 2, "image": "local", "localRankFlag": "--local-rank",
                 "args": ["--script", str(script), "--tag", "x"],
                 "failurePolicy": {"maxRestarts": 0}}}))
    result = ddpjob("run", "-f", str(manifest))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "local-rank 0 tag x ok" in result.stdout and "local-rank 1 tag x ok" in result.stdout


# -- style 2: mp.spawn with its own master ----------------------------------------------------
def test_style2_mp_spawn_script_runs_unmodified_on_one_node():
    result = ddpjob("run", "-f", str(EXAMPLES / "ddpjob-mp-spawn.yaml"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rank 0/2 ok: 32 samples here, 64 in all" in result.stdout
    assert "rank 1/2 ok: 32 samples here, 64 in all" in result.stdout


def test_style2_unmodified_on_two_nodes_fails_fast_with_the_lines_to_change(tmp_path):
    manifest = changed_example(tmp_path, "ddpjob-mp-spawn.yaml", nnodes=2,
                               failurePolicy={"maxRestarts": 3})
    started = time.monotonic()
    result = ddpjob("run", "-f", str(manifest))
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-4000:]
    assert time.monotonic() - started < 150, "not fast"
    assert "ok:" not in result.stdout, "some pod trained alone"
    assert "node 0 exited 2 (bad configuration, permanent)" in result.stderr, output[-3000:]
    assert "world_size=2, but the job has 4 processes (2 nodes x 2)" in output
    assert 'os.environ["MASTER_ADDR"] = "localhost"   -> delete' in output
    assert 'rank = int(os.environ["RANK"]) + i' in output
    assert "mp_spawn_single_node.py:" in output  # the line that called init_process_group


def test_style2_converted_script_trains_on_two_nodes(tmp_path):
    manifest = changed_example(tmp_path, "ddpjob-mp-spawn.yaml", nnodes=2,
                               args=["--script", "/workspace/mp_spawn_multi_node.py"])
    result = ddpjob("run", "-f", str(manifest))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank}/4 ok: 16 samples here, 64 in all" in result.stdout, result.stdout


# -- style 3: plain env:// reading WORLD_SIZE/RANK -------------------------------------------
def test_style3_env_script_refused_as_its_own_command_and_coherent_through_the_pod_entry(tmp_path):
    manifest = changed_example(tmp_path, "ddpjob-env-script.yaml", args=None,
                               command=["python", "/workspace/env_mnist_style.py"])
    for command in ("validate", "run"):
        result = ddpjob(command, "-f", str(manifest), timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "spec.command" in result.stderr and "launcher: none" in result.stderr
        assert "--script PATH" in result.stderr and "Traceback" not in result.stderr
    # The same script through the pod entry point: started nprocPerNode times per pod.
    result = ddpjob("run", "-f", str(EXAMPLES / "ddpjob-env-script.yaml"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank}/4 ok" in result.stdout, result.stdout


# -- style 4: pytorch/examples imagenet, explicit --dist-url/--world-size/--rank, mp.spawn ----
def test_style4_imagenet_script_runs_unmodified_with_the_jobs_values_in_its_args():
    result = ddpjob("run", "-f", str(EXAMPLES / "ddpjob-imagenet-style.yaml"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The script's own check: ranks 0..1 of one world of 2, parameters equal on both.
    for rank in range(2):
        assert f"[node-{rank}] rank {rank}/2 ok: 64 samples here" in result.stdout, result.stdout


# -- a launcher of your own in command: torchrun reads the PET_* variables ------------------
@pytest.mark.parametrize("launcher", [
    ["torchrun"],
    ["python3", "-m", "torch.distributed.run"],
])
def test_torchrun_command_starts_every_process_with_a_coherent_world(tmp_path, launcher):
    """A PyTorchJob user's `command: [torchrun, SCRIPT]`, nprocPerNode 2, 2 nodes: no flag, no
    launcher field; torchrun takes nnodes, node rank, processes and master from PET_*."""
    manifest = changed_example(tmp_path, "ddpjob-env-script.yaml",
                               command=[*launcher, "/workspace/env_mnist_style.py"],
                               args=["--epochs", "1"])
    assert ddpjob("validate", "-f", str(manifest), timeout=60).returncode == 0
    result = ddpjob("run", "-f", str(manifest))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # env_mnist_style.py all-reduces the ranks: "ok" only if they are exactly 0..3 of a world of 4.
    for rank in range(4):
        assert f"rank {rank}/4 ok" in result.stdout, result.stdout
    assert result.stdout.count("/4 ok") == 4, result.stdout


# -- a rendezvous that never completes inside the user's own init -----------------------------
def test_users_init_that_never_completes_exits_12_within_the_bound(tmp_path):
    # Local rank 1 never calls init_process_group, so rank 0's waits for it: torch's own
    # timeout is 30 minutes; the job's startupTimeoutSeconds (15 s) bounds it.
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent('''
        import datetime, os, time
        import torch.distributed as dist
        if os.environ["LOCAL_RANK"] == "1":
            time.sleep(600)
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    '''))
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({
        "apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "hang"},
        "spec": {"nnodes": 1, "nprocPerNode": 2, "image": "local", "startupTimeoutSeconds": 15,
                 "args": ["--script", str(script)], "failurePolicy": {"maxRestarts": 0}}}))
    started = time.monotonic()
    result = ddpjob("run", "-f", str(manifest), timeout=200)
    assert result.returncode == 12, result.stdout[-3000:] + result.stderr[-3000:]
    assert time.monotonic() - started < 150
    assert "init_process_group(rank=0, world_size=2" in result.stderr
    assert "did not complete within 15s" in result.stderr


def test_spawn_launcher_passes_sigterm_to_the_processes_the_script_spawned(tmp_path):
    """The kubelet's SIGTERM goes to the pod entry point alone; the spawned processes must get
    it too (to save a checkpoint), and the node reports 143."""
    import os
    import signal

    script = tmp_path / "spawner.py"
    script.write_text(textwrap.dedent('''
        import multiprocessing as mp, os, signal, sys, time

        def child(folder):
            def stop(*_):
                open(os.path.join(folder, "child-saved"), "w").close()
                sys.exit(143)
            signal.signal(signal.SIGTERM, stop)
            open(os.path.join(folder, "child-ready"), "w").close()
            time.sleep(60)

        if __name__ == "__main__":
            process = mp.get_context("spawn").Process(target=child, args=(sys.argv[1],))
            process.start()
            process.join()
            sys.exit(process.exitcode)
    '''))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env.update(DDPJOB_TERMINATION_LOG=str(tmp_path / "termination-log"), PET_NNODES="1")
    pod = subprocess.Popen([sys.executable, "-m", "ddptrainer.pod_entry", "--launcher", "spawn",
                            "--script", str(script), str(tmp_path)], env=env, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)  # its own group, as in a pod or `ddpjob run`
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "child-ready").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        pod.send_signal(signal.SIGTERM)
        code = pod.wait(timeout=60)
    finally:
        pod.kill()
    output = pod.stdout.read()
    assert (tmp_path / "child-saved").exists(), output
    assert code == 143, output
