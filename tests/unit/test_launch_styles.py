"""The launch styles, pure parts: spec -> pod environment (operator and `ddpjob run` alike),
the pod entry point's worker command line, the init guard's verdicts, the examples' scripts
(docs/launch-styles.md)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from ddpjob import contract
from ddpjob.api import spec
from ddpjob.controller import builders
from ddpjob.local import plan
from ddptrainer import init_guard, pod_entry
from tests.support import jobs

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def local_env(job: spec.DDPJob) -> dict[str, str]:
    return plan.job_environment(job, node_rank=0, master_port=1234, restart_attempt=0,
                                setup=plan.LocalSetup(scratch_dir="/tmp/x"), environ={})


# -- spec -> environment -----------------------------------------------------------------
@pytest.mark.parametrize("fields,launcher,flag", [
    ({}, "torchrun", None),
    ({"localRankFlag": "--local_rank"}, "torchrun", "--local_rank"),
    ({"launcher": "spawn", "nnodes": 1}, "spawn", None),
    ({"command": ("python", "t.py")}, "none", None),
    ({"command": ("/venv/bin/ddptrain-pod",), "localRankFlag": "--local-rank"}, "torchrun", "--local-rank"),
])
def test_pods_and_local_nodes_get_the_launcher_and_flag(fields, launcher, flag):
    job = jobs.make_job(**fields)
    for env in (env_of(builders.build_pod(job, 0, 0)), local_env(job)):
        assert env[contract.DDPJOB_LAUNCHER] == launcher
        assert env.get(contract.DDPJOB_LOCAL_RANK_FLAG) == flag
    # the command stays what the user gave (or the pod entry point)
    command = builders.build_pod(job, 0, 0)["spec"]["containers"][0]["command"]
    assert command == list(fields.get("command") or contract.DEFAULT_POD_COMMAND)


def test_launcher_and_flag_variables_are_reserved():
    assert {contract.DDPJOB_LAUNCHER, contract.DDPJOB_LOCAL_RANK_FLAG} <= contract.RESERVED_ENV_NAMES
    assert contract.DDPJOB_INIT_GUARD not in contract.RESERVED_ENV_NAMES  # the user's opt-out


# -- the pod entry point ------------------------------------------------------------------
def resolved(argv: list[str], **environ: str) -> pod_entry.PodArgs:
    return pod_entry.resolve_launch(pod_entry.parse_pod_args(argv), environ)


@pytest.mark.parametrize("flag", contract.LOCAL_RANK_FLAGS)
def test_local_rank_flag_goes_right_after_the_script_as_torch_distributed_launch_put_it(flag):
    pod = resolved(["--script", "train.py", "--epochs", "3"], DDPJOB_LOCAL_RANK_FLAG=flag)
    node = pod_entry.NodeEnv()
    assert pod_entry.torchrun_argv(pod, node, {}) == ["train.py", f"{flag}=${{local_rank}}", "--epochs", "3"]
    module = resolved(["--local-rank-flag", flag, "-m", "pkg.train", "x"])
    assert pod_entry.worker_argv(module, "0") == ["-m", "pkg.train", f"{flag}=0", "x"]


def test_torchrun_substitutes_the_local_rank_in_worker_arguments():
    # The ${local_rank} macro is torch's (torch.distributed.elastic.utils.api.macros).
    macros = pytest.importorskip("torch.distributed.elastic.utils.api").macros
    assert macros.substitute(["--local_rank=" + pod_entry.TORCHRUN_LOCAL_RANK], "3") == ["--local_rank=3"]


def test_no_flag_by_default_and_none_means_torchrun():
    pod = resolved(["--script", "t.py"], DDPJOB_LAUNCHER="none")
    assert (pod.launcher, pod.local_rank_flag) == ("torchrun", None)
    assert pod_entry.worker_argv(pod, "0") == ["t.py"]


@pytest.mark.parametrize("argv,environ,message", [
    ([], {"DDPJOB_LOCAL_RANK_FLAG": "--local_rank"}, "is for your own script"),
    (["--script", "t.py"], {"DDPJOB_LAUNCHER": "spawn", "DDPJOB_LOCAL_RANK_FLAG": "--local_rank"},
     "needs launcher torchrun"),
    ([], {"DDPJOB_LAUNCHER": "spawn"}, "launcher spawn runs your own script"),
    (["--script", "t.py"], {"DDPJOB_LAUNCHER": "mpirun"}, "DDPJOB_LAUNCHER: must be one of torchrun, spawn"),
    (["--local-rank-flag", "--rank", "--script", "t.py"], {}, "--local-rank-flag: must be one of"),
])
def test_bad_launch_settings_are_usage_errors(argv, environ, message):
    with pytest.raises(pod_entry.PodUsageError, match=message):
        resolved(argv, **environ)


# -- the init guard -----------------------------------------------------------------------
def job(nnodes=2, node_rank=1, nproc="2", master="train-node-0.train.ns.svc"):
    return init_guard.job_world({"PET_NNODES": str(nnodes), "PET_NODE_RANK": str(node_rank),
                                 "PET_NPROC_PER_NODE": nproc, "PET_MASTER_ADDR": master,
                                 "PET_MASTER_PORT": "29500",
                                 "DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS": "30"})


def test_outside_a_ddpjob_nothing_is_judged():
    assert init_guard.job_world({}) is None


def test_the_job_world():
    world = job()
    assert (world.world_size, world.ranks, world.timeout_seconds) == (4, range(2, 4), 30.0)


def test_env_init_reads_the_environment_and_a_coherent_world_passes():
    environ = {"WORLD_SIZE": "4", "RANK": "3", "MASTER_ADDR": "train-node-0.train.ns.svc", "MASTER_PORT": "29500"}
    call = init_guard.describe_call({"backend": "gloo"}, environ)
    assert call == init_guard.InitCall(4, 3, "train-node-0.train.ns.svc", 29500)
    assert init_guard.world_problems(call, job()) == []


def test_the_mp_spawn_pattern_on_two_nodes_is_refused_for_every_reason():
    environ = {"MASTER_ADDR": "localhost", "MASTER_PORT": "41234", "WORLD_SIZE": "4", "RANK": "2"}
    call = init_guard.describe_call({"backend": "gloo", "rank": 0, "world_size": 2}, environ)
    problems = init_guard.world_problems(call, job())
    assert len(problems) == 3, problems
    assert "world_size=2, but the job has 4 processes (2 nodes x 2)" in problems[0]
    assert "global ranks 2..3" in problems[1]
    assert "loopback" in problems[2]
    message = init_guard.refusal_message(call, job(), problems, "rank=0")
    assert 'os.environ["MASTER_ADDR"] = "localhost"' in message and "docs/launch-styles.md" in message


def test_tcp_init_and_store_init():
    call = init_guard.describe_call({"init_method": "tcp://127.0.0.1:23456?world_size=4&rank=2"}, {})
    assert call == init_guard.InitCall(4, 2, "127.0.0.1", 23456)
    assert init_guard.describe_call({"store": object(), "rank": 2, "world_size": 4}, {}).master_addr is None


def test_loopback_is_fine_where_the_job_itself_is_on_loopback_and_one_node_is_never_judged():
    call = init_guard.InitCall(4, 2, "127.0.0.1", 1)
    assert init_guard.world_problems(call, job(master="127.0.0.1")) == []  # `ddpjob run`
    single = init_guard.InitCall(8, 5, "localhost", 1)  # mp.spawn's own world on one node
    assert init_guard.world_problems(single, job(nnodes=1, node_rank=0, nproc="1")) == []


def test_verdicts_permanent_first(tmp_path):
    (tmp_path / "guard-1.txt").write_text("12\ntimed out\n")
    (tmp_path / "guard-2.txt").write_text("2\nrefused\nline two\n")
    (tmp_path / "rank-0.txt").write_text("not a verdict")
    assert init_guard.read_verdicts(str(tmp_path)) == [(2, "refused\nline two"), (12, "timed out")]
    assert init_guard.read_verdicts(None) == []


def test_guarded_environment_puts_the_site_first_unless_turned_off():
    env = init_guard.guarded_environment({"PYTHONPATH": "/a"})
    assert env["PYTHONPATH"].split(":") == [init_guard.site_dir(), "/a"]
    assert Path(init_guard.site_dir(), "sitecustomize.py").is_file()
    assert init_guard.guarded_environment({"DDPJOB_INIT_GUARD": "0"}) == {}


def test_the_guard_wraps_and_refuses(monkeypatch):
    calls = []

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                           store=None, group_name="", pg_options=None, device_id=None):
        calls.append((rank, world_size))

    exits = []
    monkeypatch.setattr(init_guard, "_leave_verdict_and_exit", lambda code, message: exits.append(code))
    monkeypatch.setattr(init_guard.atexit, "register", lambda function: None)
    environ = {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "1",
               "PET_MASTER_ADDR": "127.0.0.2", "MASTER_ADDR": "127.0.0.2", "MASTER_PORT": "1",
               "WORLD_SIZE": "2", "RANK": "0"}
    guarded = init_guard.guard(init_process_group, environ)
    assert init_guard.guard(guarded) is guarded
    guarded("gloo")
    assert calls == [(-1, -1)] and exits == []
    guarded("gloo", rank=0, world_size=3)
    assert exits == [2]


@pytest.mark.parametrize("environ", [
    {},  # not a DDPJob's process: nothing judged, but the exit still settles
    {"PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "x"},
])
def test_a_started_process_group_makes_the_exit_wait_for_gloo_once(monkeypatch, environ):
    """gloo's worker threads may still hold the last collective's tensors when the interpreter
    shuts down, and then abort a run that succeeded (exit 134): after an init that succeeded,
    and only then, the exit waits once, the GIL released, for them."""
    registered = []
    monkeypatch.setattr(init_guard.atexit, "register", registered.append)
    monkeypatch.setattr(init_guard, "_exit_settle_registered", False)
    outcomes = iter([RuntimeError("no peer"), None, None])

    def init_process_group(backend=None, **kwargs):
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome

    guarded = init_guard.guard(init_process_group, environ)
    with pytest.raises(RuntimeError):
        guarded("gloo")
    assert registered == []
    guarded("gloo")
    guarded("gloo")  # a second group (or a re-init) does not wait twice
    assert registered == [init_guard.settle_collectives_at_exit]
    slept = []
    monkeypatch.setattr(init_guard.time, "sleep", slept.append)
    init_guard.settle_collectives_at_exit()
    assert slept == [init_guard.EXIT_SETTLE_SECONDS] and init_guard.EXIT_SETTLE_SECONDS >= 0.1


# -- the examples ------------------------------------------------------------------------
@pytest.mark.parametrize("example,scripts", [
    ("ddpjob-launch-local-rank.yaml", ["launch_local_rank.py"]),
    ("ddpjob-mp-spawn.yaml", ["mp_spawn_single_node.py", "mp_spawn_multi_node.py"]),
    ("ddpjob-env-script.yaml", ["env_mnist_style.py"]),
    ("ddpjob-imagenet-style.yaml", ["imagenet_style.py"]),
])
def test_example_configmaps_hold_the_scripts_unchanged(example, scripts):
    configmap = next(yaml.safe_load_all((ROOT / "examples" / example).read_text()))
    for name in scripts:
        assert configmap["data"][name] == (ROOT / "examples/scripts" / name).read_text()


def test_the_launch_styles_page_is_linked():
    for page in ("README.md", "docs/contract.md"):
        assert "launch-styles.md" in (ROOT / page).read_text(), page
    assert sys.modules["ddptrainer.init_guard"].__doc__
