"""`ddpjob run`'s pure parts: each node's environment and command, the port, GPUs, volumes,
the failure policy, reading the file. Real processes are in tests/multiprocess/test_localrun.py."""
from __future__ import annotations

import argparse
import base64
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.support import jobs
from ddpjob import contract
from ddpjob.api.loader import ManifestError, load_one_ddpjob
from ddpjob.cli import run as cli_run
from ddpjob.local import runner as localrun
from ddpjob.api import spec
from ddpjob.local.plan import (LocalRunError, LocalSetup, check_gpus, expand_references, job_environment,
                               node_command, process_environment, reserve_free_port, visible_gpu_ids)
from ddpjob.local.supervisor import GangOutcome, exit_code_of
from ddpjob.local.volumes import LocalMount, materialise_mounts, rewrite_mount_paths

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def make_job(nnodes: int = 2, **spec_fields) -> spec.DDPJob:
    spec_fields.setdefault("image", "local")
    return jobs.make_job(nnodes, name="demo", namespace="team-a", uid=None, **spec_fields)


def env_for(job: spec.DDPJob, rank: int = 0, *, setup: LocalSetup | None = None, environ=None, port=40000,
            attempt=0) -> dict:
    return job_environment(job, node_rank=rank, master_port=port, restart_attempt=attempt,
                           setup=setup or LocalSetup("/scratch"), environ=environ or {})


# --- environment --------------------------------------------------------------------------------
def test_each_node_gets_the_pod_contract_on_loopback():
    job = make_job(nnodes=3, nprocPerNode=2, startupTimeoutSeconds=120)
    env = env_for(job, rank=1, port=41234, attempt=2, setup=LocalSetup("/scratch", run_uid="local-run-1"))
    expected = contract.node_environment(
        job_name="demo", namespace="team-a", master_addr="127.0.0.1", master_port=41234, nnodes=3,
        nproc_per_node=2, node_rank=1, restart_attempt=2, device="cpu", rendezvous_timeout_seconds=120,
        progress_dir="/scratch/progress-attempt-2", progress_port=0, job_uid="local-run-1")
    assert {k: env[k] for k in expected} == expected
    assert (env["RANK"], env["WORLD_SIZE"], env["PET_NODE_RANK"], env["MASTER_PORT"]) == ("2", "6", "1", "41234")


def test_spec_env_plain_values_expand_references_and_never_override_the_contract():
    job = make_job(env=(
        {"name": "GREETING", "value": "hello"},
        {"name": "WHO", "value": "node $(NODE_RANK) says $(GREETING), $$(NOT_EXPANDED) $(UNKNOWN)"},
        {"name": "RANK", "value": "99"},  # validation refuses it; the contract must still win
    ))
    env = env_for(job, rank=1)
    assert env["GREETING"] == "hello"
    assert env["WHO"] == "node 1 says hello, $(NOT_EXPANDED) $(UNKNOWN)"
    assert env["RANK"] == "1"


def test_value_from_is_read_from_the_callers_environment():
    job = make_job(env=({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},))
    assert env_for(job, environ={"HF_TOKEN": "from-shell"})["HF_TOKEN"] == "from-shell"


def test_value_from_missing_from_the_environment_is_an_error_naming_the_field(tmp_path):
    job = make_job(command=("true",),
                   env=({"name": "A", "value": "1"}, {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {}}}))
    with pytest.raises(LocalRunError, match=r"spec\.env\[1\] \(HF_TOKEN\) uses valueFrom, which needs a cluster.*export HF_TOKEN"):
        localrun.run_job(job, workdir=str(tmp_path), environ={})


def test_local_stand_ins_can_be_overridden_by_spec_env():
    setup = LocalSetup("/scratch")
    env = env_for(make_job(), rank=1, setup=setup)
    assert env["DDPJOB_TERMINATION_LOG"] == "/scratch/node-1.termination-log"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU pod sees no GPU
    overridden = env_for(make_job(env=({"name": "PYTHONUNBUFFERED", "value": ""},)))
    assert overridden["PYTHONUNBUFFERED"] == ""


def test_gpu_nodes_get_disjoint_gpus_like_pods_do():
    job = make_job(nnodes=2, nprocPerNode=2, device="gpu")
    setup = LocalSetup("/scratch", gpu_ids=("0", "1", "2", "3"))
    assert [env_for(job, r, setup=setup)["CUDA_VISIBLE_DEVICES"] for r in (0, 1)] == ["0,1", "2,3"]


def test_process_environment_drops_inherited_names_the_job_owns():
    inherited = {"PATH": "/bin", "HOME": "/root", "PET_RDZV_BACKEND": "c10d", "RANK": "7", "GROUP_RANK": "1"}
    env = process_environment({"RANK": "0", "X": "1"}, inherited)
    assert env == {"PATH": "/bin", "HOME": "/root", "GROUP_RANK": "1", "RANK": "0", "X": "1"}


@pytest.mark.parametrize("text, expected", [
    ("$(A)", "a"),
    ("x$(A)y$(B)", "xay1"),
    ("$(MISSING)", "$(MISSING)"),
    ("$$(A)", "$(A)"),
    ("$$", "$"),
    ("$A", "$A"),
    ("$(A", "$(A"),
])
def test_expand_references_follows_kubernetes(text, expected):
    assert expand_references(text, {"A": "a", "B": "1"}) == expected


# --- command ------------------------------------------------------------------------------------
def test_default_command_is_the_trainer_pod_entry_point_with_the_args():
    job = make_job(args=("--epochs", "1"))
    assert node_command(job.spec, {}) == [*contract.DEFAULT_POD_COMMAND, "--epochs", "1"]


def test_command_and_args_expand_references_and_mount_paths():
    job = make_job(command=("python", "/workspace/train.py"), args=("--node", "$(NODE_RANK)", "--out=/ckpt/run"))
    mounts = (LocalMount("/workspace", "/tmp/w", ""), LocalMount("/ckpt", "/tmp/c", ""))
    assert node_command(job.spec, {"NODE_RANK": "1"}, mounts) == [
        "python", "/tmp/w/train.py", "--node", "1", "--out=/tmp/c/run"]


# --- port ---------------------------------------------------------------------------------------
def test_reserved_port_is_held_until_released():
    holder = reserve_free_port()
    port = holder.getsockname()[1]
    assert 0 < port < 65536
    other = socket.socket()
    with pytest.raises(OSError):
        other.bind(("127.0.0.1", port))  # nobody else gets it while we hold it
    other.close()
    holder.close()
    again = socket.socket()
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a rendezvous store binds
    again.bind(("", port))
    again.close()


def test_reserved_port_lies_below_the_kernels_ephemeral_range(tmp_path):
    # Outgoing connections take their local ports from the ephemeral range: a port picked there
    # and let go for an instant can be taken by any connect() (the CI run that hit EADDRINUSE).
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    holders = [reserve_free_port() for _ in range(20)]
    try:
        assert all(1024 <= h.getsockname()[1] < low for h in holders)
    finally:
        for holder in holders:
            holder.close()
    narrow = tmp_path / "range"
    narrow.write_text("20000\t60999\n")  # no room below the range: the kernel's choice
    holder = reserve_free_port(str(narrow))
    assert holder.getsockname()[1] > 0
    holder.close()


def test_reserved_ports_differ():
    holders = [reserve_free_port() for _ in range(5)]
    assert len({h.getsockname()[1] for h in holders}) == 5
    for holder in holders:
        holder.close()


# --- GPUs ---------------------------------------------------------------------------------------
def test_visible_gpus_come_from_device_files_and_cuda_visible_devices(tmp_path):
    assert visible_gpu_ids({}, dev_dir=str(tmp_path)) == []
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert visible_gpu_ids({}, dev_dir=str(tmp_path)) == ["0", "1"]
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "1"}, dev_dir=str(tmp_path)) == ["1"]
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": ""}, dev_dir=str(tmp_path)) == []
    assert visible_gpu_ids({}, dev_dir=str(tmp_path / "absent")) == []


def test_gpu_job_without_gpus_is_refused_suggesting_cpu():
    assert check_gpus(make_job().spec, []) is None
    with pytest.raises(LocalRunError, match="no CUDA GPU.*set device: cpu"):
        check_gpus(make_job(device="gpu").spec, [])
    with pytest.raises(LocalRunError, match="needs nnodes x nprocPerNode = 4 GPUs.*has 2"):
        check_gpus(make_job(device="gpu", nprocPerNode=2).spec, ["0", "1"])
    assert check_gpus(make_job(device="gpu").spec, ["0", "1"]) == ["0", "1"]


def test_run_command_exits_2_for_a_gpu_job_on_a_machine_without_gpus(tmp_path, monkeypatch, capsys):
    manifest = write_manifest(tmp_path, {"nnodes": 2, "image": "i", "device": "gpu", "command": ["true"]})
    monkeypatch.setattr(localrun, "visible_gpu_ids", lambda environ: [])
    assert run_cli("-f", str(manifest)) == 2
    assert "set device: cpu" in capsys.readouterr().err


# --- volumes ------------------------------------------------------------------------------------
def test_volumes_become_local_directories(tmp_path):
    configmaps = {"scripts": {"metadata": {"name": "scripts"}, "data": {"a.py": "print(1)\n", "b.txt": "b"},
                              "binaryData": {"c.bin": base64.b64encode(b"\x00\x01").decode()}}}
    volumes = (
        {"name": "code", "configMap": {"name": "scripts"}},
        {"name": "picked", "configMap": {"name": "scripts", "items": [{"key": "a.py", "path": "sub/main.py"}]}},
        {"name": "data", "hostPath": {"path": "/srv/data"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}},
    )
    mounts = (
        {"name": "code", "mountPath": "/workspace/"},
        {"name": "picked", "mountPath": "/picked"},
        {"name": "data", "mountPath": "/data", "subPath": "mnist"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "ckpt", "mountPath": "/ckpt"},
    )
    result = {m.mount_path: m for m in materialise_mounts(mounts, volumes, configmaps, str(tmp_path))}
    code = Path(result["/workspace"].local_path)
    assert (code / "a.py").read_text() == "print(1)\n" and (code / "c.bin").read_bytes() == b"\x00\x01"
    assert [p.name for p in Path(result["/picked"].local_path).rglob("*")] == ["sub", "main.py"]
    assert result["/data"].local_path == "/srv/data/mnist"
    assert Path(result["/scratch"].local_path).is_dir()
    assert "needs a cluster" in result["/ckpt"].note and Path(result["/ckpt"].local_path).is_dir()


def test_configmap_item_with_a_missing_key_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no key 'nope'"):
        materialise_mounts([{"name": "v", "mountPath": "/w"}],
                           [{"name": "v", "configMap": {"name": "c", "items": [{"key": "nope"}]}}],
                           {"c": {"metadata": {"name": "c"}, "data": {}}}, str(tmp_path))


@pytest.mark.parametrize("text, expected", [
    ("/workspace", "/L"),
    ("/workspace/a.py", "/L/a.py"),
    ("--dir=/workspace/x", "--dir=/L/x"),
    ("/a:/workspace", "/a:/L"),
    ("/workspace/data/x", "/D/x"),  # the nested mount wins
    ("/workspace2", "/workspace2"),
    ("/x/workspace", "/x/workspace"),
    ("workspace", "workspace"),
])
def test_rewrite_mount_paths(text, expected):
    mounts = [LocalMount("/workspace", "/L", ""), LocalMount("/workspace/data", "/D", "")]
    assert rewrite_mount_paths(text, mounts) == expected


# --- failure policy -----------------------------------------------------------------------------
POLICY_JOB = make_job(failurePolicy=spec.FailurePolicy(maxRestarts=3))


@pytest.mark.parametrize("outcome, restarts_done, restart, code, message", [
    (GangOutcome("succeeded"), 0, False, 0, "job demo succeeded: all 2 nodes exited 0"),
    (GangOutcome("succeeded"), 2, False, 0, "after 2 restarts"),
    (GangOutcome("stopped", signum=signal.SIGINT), 0, False, 130, "SIGINT: stopped every node"),
    (GangOutcome("stopped", signum=signal.SIGTERM), 0, False, 143, "SIGTERM"),
    (GangOutcome("deadline"), 0, False, 124, "activeDeadlineSeconds"),
    (GangOutcome("failed", node_rank=0, exit_code=2), 0, False, 2,
     "node 0 exited 2 (bad configuration, permanent); job demo failed"),
    (GangOutcome("failed", node_rank=1, exit_code=137), 0, True, 137,
     "node 1 exited 137 (killed (SIGKILL, often the OOM killer), retryable); restarting the gang (restart 1/3)"),
    (GangOutcome("failed", node_rank=1, exit_code=139), 2, True, 139,
     "node 1 exited 139 (killed by signal 11, retryable); restarting the gang (restart 3/3)"),
    (GangOutcome("failed", node_rank=1, exit_code=1), 3, False, 1,
     "retryable) but the restart budget (maxRestarts 3) is spent; job demo failed"),
])
def test_restart_or_fail_applies_the_failure_policy(outcome, restarts_done, restart, code, message):
    decision = localrun.restart_or_fail(outcome, restarts_done=restarts_done, spec=POLICY_JOB.spec, job_name="demo")
    assert (decision.restart, decision.exit_code) == (restart, code)
    assert message in decision.message


def test_restart_or_fail_uses_the_jobs_own_permanent_codes():
    job = make_job(failurePolicy=spec.FailurePolicy(maxRestarts=3, permanentExitCodes=(1,)))
    decision = localrun.restart_or_fail(GangOutcome("failed", node_rank=0, exit_code=1), restarts_done=0,
                               spec=job.spec, job_name="demo")
    assert not decision.restart and "permanent" in decision.message


def test_exit_code_of_a_signalled_process_is_128_plus_the_signal():
    assert (exit_code_of(-9), exit_code_of(-15), exit_code_of(3)) == (137, 143, 3)


# --- the file and the command line -------------------------------------------------------------
def write_manifest(tmp_path: Path, job_spec: dict, *extra: dict, name="demo") -> Path:
    documents = [*extra, {"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob",
                          "metadata": {"name": name}, "spec": job_spec}]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="ddpjob")
    cli_run.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", *argv])
    return args.handler(args)


def test_load_manifest_returns_the_job_and_the_configmaps_beside_it(tmp_path):
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code"}, "data": {"a": "b"}}
    path = write_manifest(tmp_path, {"nnodes": 2, "image": "i"}, configmap)
    manifest = load_one_ddpjob(str(path))
    assert (manifest.job.name, manifest.job.spec.nnodes, list(manifest.configmaps)) == ("demo", 2, ["code"])


GOOD = "apiVersion: ddpjob.dev/v1alpha1\nkind: DDPJob\nmetadata: {name: %s}\nspec: {nnodes: 1, image: i}\n"


@pytest.mark.parametrize("content, message", [
    ("", "empty: no YAML document in the file"),
    ("kind: ConfigMap\nmetadata: {name: a}\n", "no DDPJob in the file (found: ConfigMap/a)"),
    (GOOD % "a" + "---\n" + GOOD % "b", "expected exactly one DDPJob, found 2 (a, b)"),
    ("a: [1,\n", "invalid YAML"),
    ("apiVersion: ddpjob.dev/v1alpha1\nkind: DDPJob\nmetadata: {name: x}\nspec: {nnodes: 0, image: i}\n",
     "DDPJob/x: spec.nnodes: "),
])
def test_load_manifest_errors_are_clear(tmp_path, content, message):
    path = tmp_path / "job.yaml"
    path.write_text(content)
    with pytest.raises(ManifestError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_one_ddpjob(str(path))


def test_run_command_reports_errors_with_exit_2(tmp_path, capsys):
    assert run_cli("-f", str(tmp_path / "missing.yaml")) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err
    manifest = write_manifest(tmp_path, {"nnodes": 1, "image": "i"})
    assert run_cli("-f", str(manifest), "--workdir", str(tmp_path / "nope")) == 2
    assert "not a directory" in capsys.readouterr().err


def test_dry_run_prints_each_nodes_command_and_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("API_KEY", "s3cret")
    manifest = write_manifest(tmp_path, {
        "nnodes": 2, "image": "i", "args": ["--epochs", "1"],
        "env": [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})
    assert run_cli("-f", str(manifest), "--dry-run", "--workdir", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "node 0:" in out and "node 1:" in out and f"cwd: {tmp_path}" in out
    assert "command: ddptrain-pod --epochs 1" in out
    assert "MASTER_ADDR=127.0.0.1" in out and "NODE_RANK=1" in out
    assert "API_KEY=<from your environment>" in out and "s3cret" not in out
    # the entry point restarts in place: the variables it will get, its port on loopback
    assert "DDPJOB_RESTART_MODE=InPlace" in out and "DDPJOB_PROGRESS_ADDRESS=127.0.0.1" in out
    assert "DDPJOB_RESTART_TOKEN=<a token of each run>" in out


def test_one_run_is_one_job_uid_shared_by_its_nodes_and_new_for_the_next_run(tmp_path, capsys):
    """The checkpoints' owner (docs/trainer.md): a second run of a file is another job."""
    import re

    manifest = write_manifest(tmp_path, {"nnodes": 2, "image": "i"})
    uids = []
    for _run in range(2):
        assert run_cli("-f", str(manifest), "--dry-run", "--workdir", str(tmp_path)) == 0
        found = re.findall(r"DDPJOB_UID=(\S+)", capsys.readouterr().out)
        assert len(found) == 2 and found[0] == found[1] and found[0].startswith("local-")
        uids.append(found[0])
    assert uids[0] != uids[1]


def test_suspended_job_runs_nothing(tmp_path, capsys):
    job = make_job(suspend=True, command=("false",))
    assert localrun.run_job(job, workdir=str(tmp_path)) == 0
    assert "suspend: true" in capsys.readouterr().err


def test_example_configmap_holds_the_example_script_verbatim():
    documents = list(yaml.safe_load_all((ROOT / "examples/ddpjob-plain-env.yaml").read_text()))
    configmap = next(d for d in documents if d["kind"] == "ConfigMap")
    script = (ROOT / "examples/scripts/plain_env_ddp.py").read_text()
    assert configmap["data"]["plain_env_ddp.py"] == script


def test_example_plain_env_job_is_valid_and_mounts_its_configmap():
    manifest = load_one_ddpjob(str(ROOT / "examples/ddpjob-plain-env.yaml"))
    job, configmaps = manifest.job, manifest.configmaps
    assert job.spec.nprocPerNode == 1 and job.spec.command[0] == "python"
    volume = job.spec.template.spec.volumes[0]
    assert volume["configMap"]["name"] in configmaps


def test_the_ddpjob_package_never_imports_torch():
    code = textwrap.dedent("""
        import sys
        import ddpjob.local.runner, ddpjob.local.plan, ddpjob.local.supervisor, ddpjob.local.volumes
        import ddpjob.api.validation  # what `ddpjob run` loads the file with
        from ddpjob.cli import build_parser
        build_parser()  # imports every subcommand's module
        leaked = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        sys.exit(f"torch imported: {leaked[:5]}" if leaked else 0)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
    assert result.returncode == 0, result.stderr
