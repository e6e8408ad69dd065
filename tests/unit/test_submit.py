"""`ddpjob submit`: a script or folder packaged as a ConfigMap and a DDPJob that runs it
(ddpjob.client.code_package, ddpjob.client.submission, ddpjob.cli.submit --dry-run)."""
from __future__ import annotations

import io
import os

import pytest
import yaml

from ddpjob.api.loader import load_one_ddpjob
from ddpjob.api.validation import parse_ddpjob
from ddpjob.cli.main import build_parser, main
from ddpjob.client import code_package
from ddpjob.client.code_package import CONFIGMAP_MAX_BYTES, PackageError, read_package
from ddpjob.client.submission import SubmitOptions, build_manifests, job_name_from
from ddpjob.local.volumes import materialise_mounts

pytestmark = pytest.mark.unit


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    (root / "lib").mkdir(parents=True)
    (root / "train.py").write_text("from lib.util import f\nprint(f())\n")
    (root / "lib" / "util.py").write_text("def f():\n    return 'ok'\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\x00\xff")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: x\n")
    return root


def submit_dry_run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = build_parser().parse_args(["submit", *argv, "--dry-run"])
    from ddpjob.cli.submit import run_submit
    code = run_submit(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_a_folder_keeps_its_layout_through_configmap_items(project, tmp_path):
    package = read_package(str(project))
    assert sorted(package.files) == ["lib/util.py", "train.py"]  # caches and .git left out
    assert package.entry == "train.py"
    configmap, job = build_manifests(SubmitOptions(name="project", nnodes=2), package)
    assert set(configmap["data"]) == {"train.py", "lib__util.py"}  # keys cannot hold '/'
    volume = job["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["items"] == [{"key": "lib__util.py", "path": "lib/util.py"},
                                            {"key": "train.py", "path": "train.py"}]
    # The kubelet's layout, as `ddpjob run` writes it:
    parsed = parse_ddpjob(job)
    [mount] = materialise_mounts(parsed.spec.volumeMounts, parsed.spec.template.spec.volumes,
                                 {configmap["metadata"]["name"]: configmap}, str(tmp_path / "scratch"))
    assert open(os.path.join(mount.local_path, "lib", "util.py")).read() == (project / "lib/util.py").read_text()
    assert job["spec"]["args"][:2] == ["--script", "/workspace/code/train.py"]


def test_dry_run_prints_manifests_that_validate_and_load(project, tmp_path):
    code, out, err = submit_dry_run(str(project), "--nnodes", "2", "--nproc-per-node", "2", "--name", "proj")
    assert code == 0, err
    path = tmp_path / "job.yaml"
    path.write_text(out)
    loaded = load_one_ddpjob(str(path))
    assert (loaded.job.name, loaded.job.spec.nnodes, loaded.job.spec.nprocPerNode) == ("proj", 2, 2)
    assert "proj-code" in loaded.configmaps
    assert "train.py: |" in out  # code as literal blocks, readable in a diff


def test_the_scripts_arguments_follow_the_double_dash(project, capsys):
    assert main(["submit", str(project / "train.py"), "--dry-run", "--", "--epochs", "3", "--nnodes", "9"]) == 0
    job = list(yaml.safe_load_all(capsys.readouterr().out))[-1]
    assert job["spec"]["args"] == ["--script", "/workspace/code/train.py", "--epochs", "3", "--nnodes", "9"]
    assert job["spec"]["nnodes"] == 1 and job["metadata"]["name"] == "train"


def test_torchrun_command_launch_needs_no_pod_entry_point(project):
    configmap, job = build_manifests(SubmitOptions(name="p", nproc_per_node=2, launch="torchrun-command",
                                                   script_args=("--x",)), read_package(str(project)))
    assert job["spec"]["command"] == ["torchrun", "/workspace/code/train.py"] and job["spec"]["args"] == ["--x"]
    assert parse_ddpjob(job).spec.nprocPerNode == 2


def test_too_large_is_refused_naming_the_size_the_limit_and_the_alternatives(tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    for i in range(3):
        (root / f"part{i}.py").write_text("x = 1\n" * 70_000)  # 420 KB each
    code, out, err = submit_dry_run(str(root), "--entry", "part0.py")
    assert code == 2 and out == ""
    assert "1.00 MiB" in err and "--exclude" in err and "image" in err and "shared volume" in err, err
    assert "Traceback" not in err
    # Just under the bound is fine: the bound is the API server's own (keys + values).
    package = code_package.CodePackage({"a.py": "x" * (CONFIGMAP_MAX_BYTES - len("a.py"))}, "a.py")
    code_package.check_package(package)
    with pytest.raises(PackageError, match="holds at most 1.00 MiB"):
        code_package.check_package(code_package.CodePackage({"a.py": "x" * (CONFIGMAP_MAX_BYTES - 3)}, "a.py"))


def test_binary_files_are_refused_with_the_way_out(project):
    (project / "weights.bin").write_bytes(b"\x89PNG\x00\xff\xfe")
    code, _, err = submit_dry_run(str(project))
    assert code == 2 and "weights.bin: not UTF-8 text" in err and "--exclude" in err, err
    code, out, err = submit_dry_run(str(project), "--exclude", "*.bin")
    assert code == 0, err


@pytest.mark.parametrize("argv, needle", [
    (["--nnodes", "0"], "--nnodes (spec.nnodes): must be >= 1"),
    (["--name", "Bad_Name"], "--name (metadata.name)"),
    (["--entry", "missing.py"], "--entry missing.py: not a file of"),
    (["--device", "gpu", "--nproc-per-node", "65"], "--nproc-per-node (spec.nprocPerNode)"),
    (["--cpu", "lots"], "--cpu (spec.resources.requests.cpu)"),
    (["--memory", "16 GB"], "--memory (spec.resources"),
    (["--env", "NOEQUALS"], "--env 'NOEQUALS': expected NAME=VALUE"),
    (["--env", "1X=2"], "--env '1X=2': expected NAME=VALUE"),
    (["--env", "MASTER_ADDR=x"], "--env (spec.env"),
    (["--gpus", "0"], "--gpus 0: must be at least 1"),
    (["--gpus", "4", "--device", "cpu"], "--gpus 4 and --device cpu disagree"),
    (["--gpus", "4", "--nproc-per-node", "2"], "--gpus 4 and --nproc-per-node 2 disagree"),
])
def test_bad_flags_name_the_flag(project, argv, needle):
    code, out, err = submit_dry_run(str(project), *argv)
    assert code == 2 and needle in err and out == "", err
    assert "Traceback" not in err


def test_a_folder_without_an_obvious_entry_asks_for_one(tmp_path):
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    with pytest.raises(PackageError, match="--entry FILE"):
        read_package(str(tmp_path))
    assert read_package(str(tmp_path), entry="b.py").entry == "b.py"


def test_names_a_configmap_key_cannot_hold_are_refused(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "my file.py").write_text("")
    with pytest.raises(PackageError, match="my file.py: a ConfigMap key"):
        read_package(str(tmp_path))
    (tmp_path / "my file.py").unlink()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b.py").write_text("")
    (tmp_path / "a__b.py").write_text("")
    with pytest.raises(PackageError, match="share the ConfigMap key 'a__b.py'"):
        read_package(str(tmp_path))


def test_missing_path_is_one_line(tmp_path):
    code, _, err = submit_dry_run(str(tmp_path / "nope.py"))
    assert code == 2 and "no such file or folder" in err and "Traceback" not in err


@pytest.mark.parametrize("path, name", [("train.py", "train"), ("./My_Project/", "my-project"),
                                        ("/x/2024_run.py", "run"), ("___.py", "job")])
def test_job_names_from_paths(path, name):
    assert job_name_from(path) == name


def test_help_does_not_load_the_kubernetes_client():
    import subprocess
    import sys
    code = ("import sys; from ddpjob.cli.main import build_parser; build_parser().format_help(); "
            "print('kubernetes' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# --- the knobs users reach for (issue 36, item 3) -------------------------------------------------
def job_of(out: str) -> dict:
    return list(yaml.safe_load_all(out))[-1]


def test_env_cpu_memory_and_gpus_reach_the_ddpjob_and_validate(project):
    code, out, err = submit_dry_run(str(project / "train.py"), "--gpus", "8", "--nnodes", "2", "--cpu", "16",
                                    "--memory", "64Gi", "--env", "NCCL_DEBUG=INFO", "--env", "EMPTY=",
                                    "--env", "URL=http://x/?a=b")
    assert code == 0, err
    spec = job_of(out)["spec"]
    assert (spec["device"], spec["nprocPerNode"], spec["nnodes"]) == ("gpu", 8, 2)
    assert spec["resources"] == {"requests": {"cpu": "16", "memory": "64Gi"}, "limits": {"memory": "64Gi"}}
    assert spec["env"] == [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "EMPTY", "value": ""},
                           {"name": "URL", "value": "http://x/?a=b"}]
    parse_ddpjob(job_of(out))  # what the API server will be sent validates


def test_no_knob_no_field(project):
    spec = job_of(submit_dry_run(str(project / "train.py"))[1])["spec"]
    assert not {"env", "resources", "localRankFlag"} & set(spec) and (spec["device"], spec["nprocPerNode"]) == ("cpu", 1)


LAUNCH_ERA = """import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int)
args = parser.parse_args()
"""


def test_a_launch_era_script_gets_its_local_rank_flag_and_is_told(tmp_path):
    script = tmp_path / "old.py"
    script.write_text(LAUNCH_ERA)
    code, out, err = submit_dry_run(str(script))
    assert code == 0, err
    assert job_of(out)["spec"]["localRankFlag"] == "--local_rank"
    assert "old.py defines --local_rank: each process gets --local_rank=N" in err
    dashed = tmp_path / "new.py"
    dashed.write_text(LAUNCH_ERA.replace("--local_rank", "--local-rank"))
    assert job_of(submit_dry_run(str(dashed))[1])["spec"]["localRankFlag"] == "--local-rank"
    assert "localRankFlag" not in job_of(submit_dry_run(str(script), "--local-rank-flag", "none")[1])["spec"]
    code, out, err = submit_dry_run(str(script), "--launcher", "spawn")
    assert code == 2 and "which only --launcher torchrun passes" in err and out == ""
