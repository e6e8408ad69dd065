"""`ddpjob list`, `wait`, `delete`, `status -o`, `submit --follow` and `completion`, through the
real entry point (``ddpjob.cli.main.main``) with the cluster calls answered here; the same
commands against a real API server: tests/cluster/test_e2e_cli_lifecycle.py."""
from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess

import pytest
import yaml

from ddpjob.api import names
from ddpjob.cli.main import build_parser, main
from ddpjob.client import cluster, job_table, job_wait

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.timezone.utc)


def job(name: str, phase: str = "Running", namespace: str = "team-a", **status) -> dict:
    return {"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "creationTimestamp": "2026-12-07T11:48:00Z"},
            "spec": {"nnodes": 2, "image": "img"},
            "status": {"phase": phase, "nnodes": 2, "readyNodes": 2 if phase == "Running" else 0,
                       "restarts": 1, **status}}


@pytest.fixture
def fake_cluster(monkeypatch):
    """The jobs the API server holds (namespace, name) -> job, and the calls made."""
    state = {"jobs": {}, "calls": [], "reads": {}}

    def get_job(conn, namespace, name):
        state["calls"].append(("get", namespace, name))
        answers = state["reads"].get(name)
        if answers:  # a scripted sequence of reads, then the last one for ever
            return answers.pop(0) if len(answers) > 1 else answers[0]
        return state["jobs"].get((namespace, name))

    def list_jobs(conn, namespace):
        state["calls"].append(("list", namespace))
        return [j for (ns, _), j in state["jobs"].items() if namespace is None or ns == namespace]

    def delete_job(conn, namespace, name):
        state["calls"].append(("delete", namespace, name))
        return state["jobs"].pop((namespace, name), None) is not None

    monkeypatch.setattr(cluster, "connect", lambda kubeconfig=None, context=None: object())
    monkeypatch.setattr(cluster, "get_job", get_job)
    monkeypatch.setattr(cluster, "list_jobs", list_jobs)
    monkeypatch.setattr(cluster, "delete_job", delete_job)
    monkeypatch.setattr(job_wait.time, "sleep", lambda seconds: None)
    return state


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- list ------------------------------------------------------------------------------------
def test_list_prints_kubectls_table_sorted_with_age(fake_cluster, capsys):
    fake_cluster["jobs"] = {("team-a", "zeta"): job("zeta", progress={"summary": "120/500 (24%)"}),
                            ("team-a", "alpha"): job("alpha", "Succeeded"),
                            ("team-b", "other"): job("other", namespace="team-b")}
    code, out, err = run(capsys, "list", "-n", "team-a")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "READY", "RESTARTS", "PROGRESS", "AGE"]
    assert lines[1].split()[:4] == ["alpha", "Succeeded", "0/2", "1"]
    assert lines[2].split()[:5] == ["zeta", "Running", "2/2", "1", "120/500"]
    assert lines[1].index("Succeeded") == lines[0].index("PHASE")  # columns line up
    assert len(lines) == 3


def test_list_all_namespaces_wide_name_json_yaml(fake_cluster, capsys):
    fake_cluster["jobs"] = {("team-a", "a"): job("a", "Failed", reason="RestartBudgetExhausted",
                                                  message="node 1 exited with code 1\x1b[2J"),
                            ("team-b", "b"): job("b", namespace="team-b")}
    code, out, _ = run(capsys, "list", "-A", "-o", "wide")
    assert code == 0
    head, first, second = out.splitlines()
    assert head.split() == ["NAMESPACE", "NAME", "PHASE", "READY", "RESTARTS", "PROGRESS", "AGE",
                            "REASON", "ATTEMPT", "ETA", "MESSAGE"]
    assert first.split()[:3] == ["team-a", "a", "Failed"] and "RestartBudgetExhausted" in first
    assert "\x1b" not in out and "node 1 exited with code 1" in first  # a pod's text, escaped
    assert second.split()[:2] == ["team-b", "b"]
    assert fake_cluster["calls"][-1] == ("list", None)

    _, out, _ = run(capsys, "list", "-A", "-o", "name")
    assert out == "ddpjob.ddpjob.dev/a\nddpjob.ddpjob.dev/b\n"
    _, out, _ = run(capsys, "list", "-n", "team-a", "-o", "json")
    listed = json.loads(out)
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    _, out, _ = run(capsys, "list", "-n", "team-a", "-o", "yaml")
    assert yaml.safe_load(out)["items"][0]["status"]["phase"] == "Failed"


def test_list_of_nothing_says_so_on_stderr_and_an_error_is_one_line(fake_cluster, capsys, monkeypatch):
    code, out, err = run(capsys, "list", "-n", "empty")
    assert (code, out, err) == (0, "", "No DDPJobs in namespace empty.\n")

    def refused(conn, namespace):
        raise cluster.ClusterError("list DDPJobs in namespace x: forbidden", 403)
    monkeypatch.setattr(cluster, "list_jobs", refused)
    code, out, err = run(capsys, "list", "-n", "x")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "you may not read ddpjobs in namespace x" in err


def test_list_watch_prints_a_line_per_change_until_ctrl_c(fake_cluster, capsys, monkeypatch):
    from ddpjob.cli import list_jobs

    fake_cluster["jobs"] = {("team-a", "t"): job("t", "Pending")}
    polls = iter([lambda: fake_cluster["jobs"].__setitem__(("team-a", "t"), job("t", "Running")),
                  lambda: None,  # nothing changed: nothing printed
                  lambda: fake_cluster["jobs"].pop(("team-a", "t"))])

    def sleep(seconds):
        step = next(polls, None)
        if step is None:
            raise KeyboardInterrupt
        step()
    monkeypatch.setattr(list_jobs.time, "sleep", sleep)
    code, out, _ = run(capsys, "list", "-n", "team-a", "-w")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4, out
    assert lines[1].split()[1] == "Pending" and lines[2].split()[1] == "Running"
    assert lines[3].split()[:2] == ["t", "Deleted"]


# --- wait ------------------------------------------------------------------------------------
def test_wait_exits_with_the_jobs_result(fake_cluster, capsys):
    fake_cluster["reads"]["t"] = [job("t", "Pending"), job("t", "Running"), job("t", "Succeeded")]
    code, out, err = run(capsys, "wait", "t", "-n", "team-a")
    assert (code, out) == (0, "") and err == "ddpjob wait: DDPJob team-a/t: Succeeded\n"
    assert [c for c in fake_cluster["calls"] if c[0] == "get"] == [("get", "team-a", "t")] * 3

    fake_cluster["reads"]["f"] = [job("f", "Running"), job("f", "Failed", reason="PodFailedPermanent",
                                                          message="node 0 exited with code 2")]
    code, _, err = run(capsys, "wait", "f", "-n", "team-a")
    assert code == job_wait.EXIT_JOB_FAILED == 1
    assert "Failed (PodFailedPermanent): node 0 exited with code 2 (ddpjob status f -n team-a)" in err


def test_wait_for_running_delete_a_missing_job_and_a_timeout(fake_cluster, capsys, monkeypatch):
    fake_cluster["reads"]["r"] = [job("r", "Pending"), job("r", "Running")]
    assert run(capsys, "wait", "r", "--for", "running", "-o", "json")[0] == 0
    code, _, err = run(capsys, "wait", "nope")
    assert code == job_wait.EXIT_UNREADABLE == 3 and "not there" in err
    assert run(capsys, "wait", "nope", "--for", "delete")[0] == 0

    clock = iter(range(0, 1000, 30))
    monkeypatch.setattr(job_wait.time, "monotonic", lambda: next(clock))
    fake_cluster["jobs"][("default", "slow")] = job("slow", "Running", namespace="default")
    code, _, err = run(capsys, "wait", "slow", "--timeout", "1m")
    assert code == job_wait.EXIT_TIMEOUT == 124 and "still Running after 60 s" in err


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("0", 0)])
def test_durations(text, seconds):
    assert job_wait.parse_duration(text) == seconds


def test_a_bad_duration_names_the_flag_and_the_forms(fake_cluster, capsys):
    code, _, err = run(capsys, "wait", "t", "--timeout", "ten minutes")
    assert code == 2 and err.startswith("ddpjob wait: error: --timeout: 'ten minutes' is not a duration")
    assert "10m" in err and err.count("\n") == 1


# --- delete ----------------------------------------------------------------------------------
def test_delete_deletes_each_job_once_and_says_which_were_missing(fake_cluster, capsys):
    fake_cluster["jobs"] = {("team-a", "a"): job("a"), ("team-a", "b"): job("b")}
    code, out, err = run(capsys, "delete", "a", "missing", "b", "a", "-n", "team-a", "--wait")
    assert code == 1
    assert out == "ddpjob.ddpjob.dev/a deleted\nddpjob.ddpjob.dev/b deleted\n"
    assert err == "ddpjob delete: error: no DDPJob missing in namespace team-a\n"
    assert [c for c in fake_cluster["calls"] if c[0] == "delete"] == [
        ("delete", "team-a", "a"), ("delete", "team-a", "missing"), ("delete", "team-a", "b")]
    assert fake_cluster["jobs"] == {}


def test_delete_sends_a_background_deletion(monkeypatch):
    from tests.support.operator_fakes import FakeApiClient

    api = FakeApiClient(missing={"gone"})
    conn = cluster.Connection(api)
    assert cluster.delete_job(conn, "ns", "train") is True
    assert cluster.delete_job(conn, "ns", "gone") is False
    method, url, _, body, _ = api.requests[0]
    assert (method, url) == ("DELETE", "/apis/ddpjob.dev/v1alpha1/namespaces/ns/ddpjobs/train")
    assert body["propagationPolicy"] == "Background"


def test_list_jobs_reads_every_page():
    class Pages:
        def __init__(self):
            self.queries = []

        def param_serialize(self, method, resource_path, query_params=None, header_params=None, body=None,
                            auth_settings=None):
            return method, resource_path, query_params

        def call_api(self, method, path, query, _request_timeout=None):
            from tests.support.operator_fakes import FakeResponse

            self.queries.append((path, dict(query)))
            token = dict(query).get("continue")
            if token is None:
                return FakeResponse(200, {"items": [job("a")], "metadata": {"continue": "page2"}})
            return FakeResponse(200, {"items": [job("b")], "metadata": {}})

    api = Pages()
    jobs = cluster.list_jobs(cluster.Connection(api), None)
    assert [j["metadata"]["name"] for j in jobs] == ["a", "b"]
    assert api.queries[0] == ("/apis/ddpjob.dev/v1alpha1/ddpjobs", {"limit": "500"})


# --- status -o --------------------------------------------------------------------------------
def test_status_output_json_and_yaml_are_the_object(fake_cluster, capsys):
    fake_cluster["jobs"][("team-a", "t")] = job("t", progress={"step": 40})
    code, out, _ = run(capsys, "status", "t", "-n", "team-a", "-o", "json")
    assert code == 0 and json.loads(out) == fake_cluster["jobs"][("team-a", "t")]
    _, out, _ = run(capsys, "status", "t", "-n", "team-a", "-o", "yaml")
    assert yaml.safe_load(out)["status"]["progress"] == {"step": 40}


# --- the table's parts --------------------------------------------------------------------------
@pytest.mark.parametrize("seconds, shown", [(5, "5s"), (59, "59s"), (60, "1m"), (3599, "59m"),
                                            (7199, "119m"), (7200, "2h"), (86400 * 2, "2d"),
                                            (86400 * 800, "2y")])
def test_age_is_kubectls(seconds, shown):
    created = (NOW - dt.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
    assert job_table.age(created, NOW) == shown
    assert job_table.age(None, NOW) == "<unknown>"


# --- completion -------------------------------------------------------------------------------
def test_completion_knows_every_command_and_its_flags():
    commands = __import__("ddpjob.cli.completion", fromlist=["commands"]).commands(build_parser())
    assert {"submit", "status", "logs", "list", "wait", "delete", "run", "validate", "render"} <= set(commands)
    assert "--follow" in commands["submit"][0] and commands["wait"][1] and not commands["submit"][1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
def test_bash_completion_completes_commands_flags_and_job_names(tmp_path, capsys):
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "ddpjob.bash"
    script.write_text(capsys.readouterr().out)
    fake = tmp_path / "fake-ddpjob"  # answers `list -o name` as a cluster would, and logs its arguments
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\n'
                    'printf "ddpjob.ddpjob.dev/train\\nddpjob.ddpjob.dev/tune\\nddpjob.ddpjob.dev/eval\\n"\n')
    fake.chmod(0o755)

    def complete(*words):
        line = " ".join(words)
        probe = (f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; '
                 '_ddpjob_complete; printf "%s\\n" "${COMPREPLY[@]}"')
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "DDPJOB_COMPLETION_COMMAND": str(fake)})
        assert done.returncode == 0, done.stderr
        return sorted(filter(None, done.stdout.splitlines()))

    assert complete("ddpjob", "st") == ["status"]
    assert complete("ddpjob", "wait", "--f") == ["--for"]
    assert complete("ddpjob", "status", "-n", "team-a", "t") == ["train", "tune"]
    assert (tmp_path / "args").read_text().split() == ["list", "-o", "name", "-n", "team-a"]
    assert complete("ddpjob", "submit", "--fol") == ["--follow"]


# --- submit --follow ------------------------------------------------------------------------------
def node_pod(job_name: str, rank: int) -> dict:
    """A node pod of ``job(job_name)`` as the operator makes it (its labels, name and owner)."""
    return {"metadata": {"name": names.node_pod_name(job_name, rank), "uid": f"pod-{rank}",
                         "labels": {names.LABEL_JOB_NAME: job_name, names.LABEL_NODE_RANK: str(rank)},
                         "ownerReferences": [{"kind": names.KIND, "uid": f"uid-{job_name}", "controller": True}]}}


@pytest.fixture
def submitting(fake_cluster, monkeypatch, tmp_path):
    """`ddpjob submit` against the fake: the job appears on create; ``pods`` says when pods exist."""
    from ddpjob.cli import follow as follow_module, logs

    state = {"pods": [], "logs": [], "log_code": 0}
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")

    def create_job(conn, body):
        created = {**body, "metadata": {**body["metadata"], "uid": "uid-1"}}
        fake_cluster["jobs"][(body["metadata"]["namespace"], body["metadata"]["name"])] = created
        return created

    def run_logs(args, out, err):
        state["logs"].append((args.job, args.follow))
        out.write("node-0 | hello\n")
        if state["log_code"]:
            err.write("ddpjob logs: error: the kubelet does not serve logs here\n")
        return state["log_code"]

    monkeypatch.setattr(cluster, "put_configmap", lambda conn, cm, owned_if: cm)
    monkeypatch.setattr(cluster, "create_job", create_job)
    monkeypatch.setattr(cluster, "own_configmap", lambda conn, cm, job: None)
    monkeypatch.setattr(cluster, "list_pods", lambda conn, ns, selector: list(state["pods"]))
    monkeypatch.setattr(logs, "run_logs", run_logs)
    monkeypatch.setattr(follow_module.time, "sleep", lambda seconds: None)
    state["script"] = str(script)
    return state


def test_submit_follow_prints_the_logs_and_exits_with_the_result(fake_cluster, submitting, capsys):
    fake_cluster["reads"]["train"] = [
        None,  # the existence check before the creation
        job("train", "Pending", namespace="default", reason="ImageNotPulled", message="pull it: make push"),
        job("train", "Running", namespace="default"),
        job("train", "Failed", namespace="default", reason="PodFailedPermanent", message="exit 2")]
    submitting["pods"] = [node_pod("train", 0), node_pod("train", 1)]
    code, out, err = run(capsys, "submit", submitting["script"], "--follow")
    assert code == 1, err
    assert out == "ddpjob.ddpjob.dev/train\nnode-0 | hello\n"
    assert "train: Pending (ImageNotPulled): pull it: make push" in err
    assert err.rstrip().endswith("Failed (PodFailedPermanent): exit 2 (ddpjob status train -n default)")
    assert submitting["logs"] == [("train", True)]


def test_submit_follow_without_logs_still_waits_for_the_result(fake_cluster, submitting, capsys):
    fake_cluster["reads"]["train"] = [None, job("train", "Running", namespace="default"),
                                      job("train", "Succeeded", namespace="default")]
    submitting["pods"], submitting["log_code"] = [node_pod("train", 0), node_pod("train", 1)], 1
    code, _, err = run(capsys, "submit", submitting["script"], "--follow")
    assert code == 0, err
    assert "the kubelet does not serve logs here" in err and "waiting for the job's result" in err
    assert err.rstrip().endswith("DDPJob default/train: Succeeded")


def test_submit_follow_starts_the_logs_once_every_node_has_its_pod(fake_cluster, submitting, capsys, monkeypatch):
    """The operator creates the pods one by one; following at the first would leave out the
    nodes whose pods came after it (seen on kind under load: node 1's lines missing)."""
    listings = iter([[node_pod("train", 0)], [node_pod("train", 0), node_pod("other", 1)],
                     [node_pod("train", 0), node_pod("train", 1)]])
    from ddpjob.client import cluster as cluster_module
    monkeypatch.setattr(cluster_module, "list_pods", lambda conn, ns, selector: next(listings))
    fake_cluster["reads"]["train"] = [None, job("train", "Pending", namespace="default"),
                                      job("train", "Pending", namespace="default"),
                                      job("train", "Running", namespace="default"),
                                      job("train", "Succeeded", namespace="default")]
    code, out, err = run(capsys, "submit", submitting["script"], "--follow")
    assert code == 0, err
    assert submitting["logs"] == [("train", True)] and next(listings, None) is None  # after the third listing


def test_submit_without_follow_prints_kubectls_name_line(fake_cluster, submitting, capsys):
    code, out, err = run(capsys, "submit", submitting["script"])
    assert code == 0 and out == "ddpjob.ddpjob.dev/train\n", err
    assert submitting["logs"] == []
