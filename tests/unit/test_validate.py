"""Validation of DDPJob manifests: the tables of bad and good inputs, and `ddpjob validate`."""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from ddpjob.api import loader
from ddpjob.cli import validate as cli_validate
from ddpjob.api import validation
from tests.support.manifests import (NOT_SENDABLE, REJECTS, REJECTS_WHEN_STRICT, bad_manifest_table,
                                   good_manifest_table, minimal_manifest, several_problems_case,
                                   update_table, with_changes)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BAD = bad_manifest_table()
GOOD = good_manifest_table()


# ---------------------------------------------------------------------------------------------
# The tables (the cluster suite sends the same manifests to the real API server)
# ---------------------------------------------------------------------------------------------
def test_the_bad_table_is_big_and_well_formed():
    assert len(BAD) >= 20
    assert len({case.id for case in BAD}) == len(BAD)
    assert {case.server for case in BAD} <= {REJECTS, REJECTS_WHEN_STRICT, NOT_SENDABLE}


@pytest.mark.parametrize("case", BAD, ids=[case.id for case in BAD])
def test_bad_manifest_names_the_field_and_what_is_allowed(case):
    problems = validation.validate_ddpjob(case.manifest)
    # One problem per case, so each case shows that exactly this check fires.
    assert [p.path for p in problems] == [case.path], problems
    assert case.message in problems[0].message
    with pytest.raises(validation.InvalidDDPJob):
        validation.parse_ddpjob(case.manifest)


@pytest.mark.parametrize("name,manifest", GOOD, ids=[name for name, _ in GOOD])
def test_good_manifest_is_valid(name, manifest):
    assert validation.validate_ddpjob(manifest) == []


def _example_ddpjobs() -> list:
    docs = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(doc, dict) and doc.get("kind") == "DDPJob":
                docs.append(pytest.param(doc, id=f"{path.name}#{i}"))
    return docs or [pytest.param(None, marks=pytest.mark.skip(reason="no examples/*.yaml DDPJob yet"))]


@pytest.mark.parametrize("manifest", _example_ddpjobs())
def test_examples_are_valid(manifest):
    assert validation.validate_ddpjob(manifest) == []


# No public registry hosts DDPJob's images: every file a user copies names them as `make images`
# builds them (localhost/ddpjob/...), so a pod never waits on a pull that cannot succeed.
# (The -cuda tag is trainer/Dockerfile's documented CUDA build.)
PROJECT_IMAGES = {"localhost/ddpjob/trainer:0.1.0", "localhost/ddpjob/operator:0.1.0",
                  "localhost/ddpjob/trainer:0.1.0-cuda"}


def _images_named(node) -> list[str]:
    if isinstance(node, dict):
        found = [node["image"]] if isinstance(node.get("image"), str) else []
        return found + [i for value in node.values() for i in _images_named(value)]
    if isinstance(node, list):
        return [i for value in node for i in _images_named(value)]
    return []


@pytest.mark.parametrize("path", sorted([*(ROOT / "examples").glob("*.yaml"), *(ROOT / "manifests").glob("*.yaml")]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_examples_and_manifests_name_only_the_images_make_images_builds(path):
    images = [i for doc in yaml.safe_load_all(path.read_text()) for i in _images_named(doc)]
    assert set(images) <= PROJECT_IMAGES, f"{path.name} names {sorted(set(images) - PROJECT_IMAGES)}"


@pytest.mark.parametrize("obj,expected", [
    ([1, 2], "a DDPJob must be a mapping (apiVersion, kind, metadata, spec), got a list"),
    ("text", 'a DDPJob must be a mapping (apiVersion, kind, metadata, spec), got string "text"'),
    ({"apiVersion": "v1", "kind": "ConfigMap"}, "kind: must be DDPJob (got kind 'ConfigMap')"),
    ({"spec": {}}, "kind: must be DDPJob (kind is missing)"),
])
def test_not_a_ddpjob_at_all(obj, expected):
    assert [str(p) for p in validation.validate_ddpjob(obj)] == [expected]


@pytest.mark.parametrize("metadata,expected", [
    (None, ["metadata.name: required"]),
    ({}, ["metadata.name: required"]),
    ({"generateName": "job-"}, ["metadata.name: required (generateName is not supported: the name "
                                "decides the pods' names)"]),
    ({"name": 5}, ["metadata.name: must be a string, got integer 5"]),
    ("x", ["metadata: must be a mapping, got string \"x\""]),
    ({"name": "j", "labels": {"v": 2}}, ['metadata.labels.v: must be a string, got integer 2 '
                                         '(quote it in YAML: "2")']),
])
def test_metadata_problems(metadata, expected):
    manifest = minimal_manifest()
    manifest["metadata"] = metadata
    assert [str(p) for p in validation.validate_ddpjob(manifest)] == expected


def test_a_yaml_boolean_where_a_string_belongs_gets_a_quoting_hint():
    manifest = minimal_manifest()
    manifest["spec"]["args"] = ["--amp", True]
    [problem] = validation.validate_ddpjob(manifest)
    assert str(problem) == 'spec.args[1]: must be a string, got boolean true (quote it in YAML: "true")'


def test_map_keys_must_be_strings():
    manifest = minimal_manifest()
    manifest["spec"]["template"] = {"spec": {"nodeSelector": {1: "a"}}}
    assert [str(p) for p in validation.validate_ddpjob(manifest)] == [
        "spec.template.spec.nodeSelector: keys must be strings, got integer 1 (quote it)"]


def test_unknown_fields_inside_kubernetes_fragments_are_kept():
    manifest = minimal_manifest()
    manifest["spec"]["template"] = {"spec": {"volumes": [{"name": "d", "hostPath": {"path": "/x"}}]}}
    job = validation.parse_ddpjob(manifest)
    assert job.spec.template.spec.volumes == ({"name": "d", "hostPath": {"path": "/x"}},)


# ---------------------------------------------------------------------------------------------
# `ddpjob validate`
# ---------------------------------------------------------------------------------------------
def _run(capsys, *argv: str, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    parser = argparse.ArgumentParser(prog="ddpjob")
    cli_validate.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["validate", *argv])
    code = args.handler(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


VALID = """\
    apiVersion: ddpjob.dev/v1alpha1
    kind: DDPJob
    metadata:
      name: mnist
    spec:
      nnodes: 2
      image: trainer:1
    """


def test_cli_valid_file(tmp_path, capsys):
    f = _write(tmp_path, "job.yaml", VALID)
    assert _run(capsys, "-f", f) == (0, f"{f}: DDPJob/mnist is valid\n", "")


def test_cli_one_line_per_problem(tmp_path, capsys):
    f = _write(tmp_path, "job.yaml", """\
        apiVersion: ddpjob.dev/v1alpha1
        kind: DDPJob
        metadata: {name: mnist}
        spec:
          nnodes: 0
          image: trainer:1
          device: tpu
          env: [{value: x}]
          extra: 1
        """)
    code, out, err = _run(capsys, "--filename", f)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"{f}: DDPJob/mnist: spec.nnodes: must be >= 1, got 0",
        f"{f}: DDPJob/mnist: spec.device: must be one of cpu, gpu, got 'tpu'",
        f"{f}: DDPJob/mnist: spec.env[0].name: required",
        f"{f}: DDPJob/mnist: spec.extra: unknown field",
    ]


def test_cli_rule_problem(tmp_path, capsys):
    f = _write(tmp_path, "job.yaml", VALID + "  env: [{name: RANK, value: '0'}]\n")
    code, _, err = _run(capsys, "-f", f)
    assert code == 2 and err.startswith(f"{f}: DDPJob/mnist: spec.env[0].name: env may not set the names")


def test_cli_skips_other_kinds_with_a_note(tmp_path, capsys):
    config_map = 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: train-script}\ndata: {a: "1"}\n---\n'
    f = _write(tmp_path, "job.yaml", config_map + textwrap.dedent(VALID))
    code, out, err = _run(capsys, "-f", f)
    assert (code, out) == (0, f"{f}: DDPJob/mnist is valid\n")
    assert err == f"{f}: note: skipping ConfigMap/train-script (not a DDPJob)\n"


def test_cli_every_ddpjob_of_a_file_is_checked(tmp_path, capsys):
    second = textwrap.dedent(VALID).replace("mnist", "second").replace("nnodes: 2", "nnodes: -1")
    f = _write(tmp_path, "jobs.yaml", textwrap.dedent(VALID) + "---\n" + second)
    code, out, err = _run(capsys, "-f", f)
    assert code == 2
    assert out == f"{f}: DDPJob/mnist is valid\n"
    assert err == f"{f}: DDPJob/second: spec.nnodes: must be >= 1, got -1\n"


def test_cli_kind_list_is_expanded(tmp_path, capsys):
    item = yaml.safe_load(textwrap.dedent(VALID))
    f = _write(tmp_path, "list.yaml", yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [item]}))
    assert _run(capsys, "-f", f)[0] == 0


def test_cli_several_files(tmp_path, capsys):
    good = _write(tmp_path, "good.yaml", VALID)
    code, out, err = _run(capsys, "-f", good, "-f", str(tmp_path / "missing.yaml"))
    assert code == 2 and out == f"{good}: DDPJob/mnist is valid\n"
    assert err == f"{tmp_path / 'missing.yaml'}: no such file\n"


def test_cli_stdin(capsys, monkeypatch):
    assert _run(capsys, "-f", "-", stdin=textwrap.dedent(VALID), monkeypatch=monkeypatch) == (
        0, "<stdin>: DDPJob/mnist is valid\n", "")


@pytest.mark.parametrize("text,message", [
    ("", "empty: no YAML document in the file"),
    ("# only a comment\n---\n", "empty: no YAML document in the file"),
    ("spec: [1\n", "line 2, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'"),
    ("a: b\n  c: d\n", "line 2, column 4: invalid YAML: mapping values are not allowed here"),
    ("kind: DDPJob\nspec: {}\nspec: {}\n", "line 3, column 1: invalid YAML: duplicate key 'spec'"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", "no DDPJob in the file (found: ConfigMap/c)"),
    ("- 1\n- 2\n", "document 1 (line 1): not a Kubernetes object (a mapping with apiVersion and kind), "
                   "got a list"),
    ("just text\n", 'document 1 (line 1): not a Kubernetes object (a mapping with apiVersion and kind), '
                    'got string "just text"'),
    ("apiVersion: ddpjob.dev/v1alpha1\nkind: DDPJob\nmetadata: {name: j}\nspec: {nnodes: 1, image: i, "
     "nnode: 2}\n", "DDPJob/j: spec.nnode: unknown field"),
    ("apiVersion: ddpjob.dev/v1alpha1\nkind: DDPjob\nmetadata: {name: j}\n",
     "DDPjob/j: kind: must be DDPJob (got kind 'DDPjob')"),
])
def test_cli_each_bad_file_is_one_clear_line(tmp_path, capsys, text, message):
    f = _write(tmp_path, "job.yaml", text)
    code, out, err = _run(capsys, "-f", f)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"{f}: {message}"


def test_cli_unreadable_files(tmp_path, capsys):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert _run(capsys, "-f", str(binary))[2] == f"{binary}: not UTF-8 text (byte 0)\n"
    assert _run(capsys, "-f", str(tmp_path))[2] == f"{tmp_path}: is a directory, not a file\n"


def test_cli_without_filename_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as caught:
        _run(capsys)
    assert caught.value.code == 2


def test_cli_as_a_process_never_prints_a_traceback(tmp_path):
    f = _write(tmp_path, "job.yaml", "spec: [\n")
    done = subprocess.run([sys.executable, "-m", "ddpjob.cli", "validate", "-f", f],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"{f}: line 2, column 1: invalid YAML: expected the node content, but found " \
                          "'<stream end>'\n"


def test_cli_through_the_ddpjob_command(tmp_path, capsys):
    from ddpjob import cli

    f = _write(tmp_path, "job.yaml", VALID)
    assert cli.main(["validate", "-f", f]) == 0
    assert capsys.readouterr().out == f"{f}: DDPJob/mnist is valid\n"


def test_load_ddpjobs_for_render_and_run(tmp_path):
    f = _write(tmp_path, "job.yaml", VALID)
    [job] = loader.load_ddpjobs(f, default_namespace="ns")
    assert (job.name, job.namespace, job.spec.nnodes) == ("mnist", "ns", 2)
    bad = _write(tmp_path, "bad.yaml", VALID.replace("nnodes: 2", "nnodes: 0"))
    with pytest.raises(loader.ManifestError, match=r"bad.yaml: DDPJob/mnist: spec.nnodes: must be >= 1"):
        loader.load_ddpjobs(bad)
    with pytest.raises(loader.ManifestError, match="missing.yaml: no such file"):
        loader.load_ddpjobs(str(tmp_path / "missing.yaml"))


def test_load_ddpjobs_validates_each_document_once(tmp_path, monkeypatch):
    second = textwrap.dedent(VALID).replace("name: mnist", "name: second")
    f = _write(tmp_path, "jobs.yaml", textwrap.dedent(VALID) + "---\n" + second)
    checked = []
    real = validation.defaulted_manifest

    def counting(obj, old=None):
        checked.append(obj["metadata"]["name"])
        return real(obj, old)

    monkeypatch.setattr(validation, "defaulted_manifest", counting)
    jobs = loader.load_ddpjobs(f, default_namespace="ns")
    assert [(j.name, j.namespace) for j in jobs] == [("mnist", "ns"), ("second", "ns")]
    assert checked == ["mnist", "second"]
    assert jobs[0] == validation.parse_ddpjob(yaml.safe_load(textwrap.dedent(VALID)), default_namespace="ns")


# ---------------------------------------------------------------------------------------------
# One loader for every command: the same file gets the same one-line verdict and exit 2 from
# validate, render and run (run used to crash on non-UTF-8 and to accept a repeated key).
# ---------------------------------------------------------------------------------------------
_GOOD_TEXT = "apiVersion: ddpjob.dev/v1alpha1\nkind: DDPJob\nmetadata: {name: demo}\nspec:\n"


@pytest.mark.parametrize("content, line", [
    (b"\xff\xfe" + _GOOD_TEXT.encode() + b"  nnodes: 2\n  image: i\n", "not UTF-8 text (byte 0)"),
    ((_GOOD_TEXT + "  nnodes: 2\n  nnodes: 3\n  image: i\n").encode(), "duplicate key 'nnodes'"),
    (b"", "empty: no YAML document in the file"),
], ids=["not-utf8", "duplicate-key", "empty"])
@pytest.mark.parametrize("command", [["validate"], ["render"], ["run", "--dry-run"]])
def test_every_command_refuses_a_bad_file_with_one_line_and_exit_2(tmp_path, command, content, line):
    path = tmp_path / "job.yaml"
    path.write_bytes(content)
    done = subprocess.run([sys.executable, "-m", "ddpjob.cli", *command, "-f", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    [message] = done.stderr.strip().splitlines()
    assert str(path) in message and line in message


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path):
    from ddpjob.api.loader import MAX_MANIFEST_BYTES

    path = tmp_path / "huge.yaml"
    path.write_bytes(b"# " + b"x" * MAX_MANIFEST_BYTES + b"\n")
    done = subprocess.run([sys.executable, "-m", "ddpjob.cli", "validate", "-f", str(path)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "too large" in done.stderr and "at most 3145728 bytes" in done.stderr


# ---------------------------------------------------------------------------------------------
# Every problem at once; edits of a stored job (the cluster suite sends the same cases)
# ---------------------------------------------------------------------------------------------
def test_every_problem_is_reported_in_one_go_field_errors_and_rules_alike():
    manifest, expected = several_problems_case()
    problems = validation.validate_ddpjob(manifest)
    assert sorted(p.path for p in problems) == sorted(expected), problems
    for problem in problems:
        assert expected[problem.path] in problem.message, problem


def test_a_rule_with_malformed_input_is_skipped_not_guessed():
    problems = validation.validate_ddpjob(with_changes({"spec.env": [{"value": "x"}, {"name": "RANK"}],
                                                    "metadata.name": 7}))
    assert [p.path for p in problems] == ["metadata.name", "spec.env[0].name", "spec.env[1].name"]


@pytest.mark.parametrize("case", update_table(), ids=lambda c: c.id)
def test_an_edit_is_judged_against_the_stored_job(case):
    assert validation.validate_ddpjob(case.old) == []
    problems = validation.validate_ddpjob(case.new, case.old)
    assert [p.path for p in problems] == ([case.path] if case.path else []), problems
    assert all(case.message in p.message for p in problems)
    # Without the stored object, the same manifest is a valid create.
    assert validation.validate_ddpjob(case.new) == []


def test_the_update_table_covers_every_pod_shaping_field_rule_it_needs():
    refused = [c for c in update_table() if c.path]
    allowed = [c for c in update_table() if not c.path]
    assert len(refused) >= 6 and len(allowed) >= 6
    assert {c.old.get("status", {}).get("phase") for c in refused} == {"Pending", "Running", "Restarting"}


def test_cli_against_the_stored_job(tmp_path, capsys):
    stored = with_changes({"metadata.namespace": "team", "status": {"phase": "Running"}})
    edited = with_changes({"spec.nnodes": 3, "spec.failurePolicy": {"maxRestarts": 9}})
    live = tmp_path / "live.yaml"
    live.write_text(yaml.safe_dump(stored))
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(edited))
    code, out, err = _run(capsys, "-f", str(f), "--against", str(live))
    assert code == 2 and out == ""
    assert err.splitlines() == [f"{f}: DDPJob/mnist: spec.nnodes: cannot change while the job "
                                "runs (status.phase Pending, Running or Restarting): suspend the job "
                                "(spec.suspend: true, possibly in the same edit) or wait until it has finished"]
    # The same file alone is a valid new job; against a suspended one, a valid edit.
    assert _run(capsys, "-f", str(f))[0] == 0
    stored["status"]["phase"] = "Suspended"
    live.write_text(yaml.safe_dump(stored))
    assert _run(capsys, "-f", str(f), "--against", str(live))[0] == 0
