"""The API server itself refuses invalid DDPJobs, naming the field, and
`ddpjob validate` gives the same verdicts.

Every manifest of ``tests.support.manifests`` (the tables the unit tests check `ddpjob validate`
with) goes to the real API server with the CRD from manifests/ installed, as ``kubectl apply``
sends it (strict field validation):

* each invalid one is refused, and the refusal names the case's field path (``api_path``),
  with the rule's own message when a CEL rule refused it; the real ``ddpjob validate -f FILE``
  on the same manifest exits 2 naming the same path (``path``; the two differ for one case,
  recorded in the table);
* each valid one is accepted, the API server's defaults are exactly those of
  ``validation.defaulted_manifest``, and ``ddpjob validate`` exits 0;
* ``kubectl get ddpjobs`` shows the printer columns.

The cases are sent as server-side dry runs (``dryRun=All``): decoding, defaulting, schema and
CEL validation and admission all run, nothing is stored, so valid jobs never start pods even
when another test module has the operator running. One job is created for real, for the
printer columns. The ``ddpjob validate`` runs go in parallel, one process per manifest.
"""
from __future__ import annotations

import concurrent.futures
import copy
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ddpjob.api import openapi
from ddpjob.api import validation
from tests.support.manifests import (NOT_SENDABLE, REJECTS, REJECTS_WHEN_STRICT, bad_manifest_table,
                                   good_manifest_table, several_problems_case, update_table)

from tests.testbed.operator_runner import apply_manifests

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
# Wrong kind or apiVersion: the API server would route those to another resource, so only
# `ddpjob validate` can judge them (the unit tests do).
BAD = [case for case in bad_manifest_table() if case.server != NOT_SENDABLE]
GOOD = good_manifest_table()
RULE_MESSAGES = {rule.message for rule in openapi.all_rules() if not rule.transition}


def _sendable(manifest: dict, name: str) -> dict:
    """The manifest as both judges get it: named after its case (unless the name is what the
    case is about) so every case is one object of its own."""
    manifest = copy.deepcopy(manifest)
    metadata = manifest.get("metadata")
    if isinstance(metadata, dict) and metadata.get("name") == "mnist":
        metadata["name"] = name
    return manifest


BAD_MANIFESTS = {case.id: _sendable(case.manifest, case.id) for case in BAD}
GOOD_MANIFESTS = {name: _sendable(manifest, name) for name, manifest in GOOD}


def ddpjob_command() -> list[str]:
    """The installed `ddpjob` console script of this Python (not a pyenv shim: it starts in
    half the time), else whatever is on PATH."""
    beside = Path(sys.executable).with_name("ddpjob")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("ddpjob")
    if not found:
        pytest.fail("the ddpjob command is not installed (pip install -e .)")
    return [found]


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def crd_installed(kubectl) -> None:
    """The CRD (and the rest of manifests/ but the Deployment), as the operator fixture
    applies it: server-side, waited for Established. Idempotent, so it does not matter which
    module applies it first."""
    apply_manifests(kubectl, include_workloads=False)


@pytest.fixture(scope="module")
def cases_namespace(kubectl, crd_installed) -> str:
    """One namespace for the dry-run cases of this module (nothing is stored in it)."""
    name = f"api-validation-{secrets.token_hex(3)}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="module")
def custom_objects(cluster):
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api_client)


@pytest.fixture(scope="module")
def send(custom_objects, cases_namespace):
    """``send(manifest, field_validation="Strict") -> (accepted, object or error Status)``:
    a dry-run create in the module's namespace."""
    from kubernetes.client.rest import ApiException

    def send(manifest: dict, field_validation: str = "Strict"):
        body = copy.deepcopy(manifest)
        if isinstance(body.get("metadata"), dict):
            # The cases' own namespaces (ml, ns) do not exist here; resourceVersion is the
            # operator's view of a stored object and a create must not carry one.
            body["metadata"]["namespace"] = cases_namespace
            body["metadata"].pop("resourceVersion", None)
        try:
            created = custom_objects.create_namespaced_custom_object(
                GROUP, VERSION, cases_namespace, PLURAL, body, dry_run="All",
                field_validation=field_validation)
        except ApiException as error:
            try:
                status = json.loads(error.body)
            except (TypeError, ValueError):
                status = {"code": error.status, "message": str(error.body)}
            return False, status
        return True, created

    return send


@pytest.fixture(scope="module")
def cli_verdicts(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """``ddpjob validate -f FILE`` of every case, the real command, run in parallel."""
    folder = tmp_path_factory.mktemp("manifests")
    files = {}
    for case_id, manifest in {**BAD_MANIFESTS, **GOOD_MANIFESTS}.items():
        path = folder / f"{case_id}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        files[case_id] = path
    command = ddpjob_command()

    def run(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([*command, "validate", "-f", str(path)], capture_output=True,
                              text=True, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 2)) as pool:
        results = dict(zip(files, pool.map(run, files.values())))
    return results


# -- helpers --------------------------------------------------------------------------------
def named_fields(status: dict) -> list[str]:
    """The field paths an API server refusal names: its causes' fields, or, for a strict
    decoding error (which carries no causes), the fields its message calls unknown."""
    fields = [cause.get("field", "") for cause in status.get("details", {}).get("causes", [])]
    return fields + re.findall(r'unknown field "([^"]+)"', status.get("message", ""))


def ddpjob_validate_paths(result: subprocess.CompletedProcess, case_id: str) -> list[str]:
    """The field paths of `ddpjob validate`'s problem lines (``FILE: DDPJob/NAME: PATH: ...``)."""
    paths = []
    for line in result.stderr.splitlines():
        match = re.match(rf"\S+/{re.escape(case_id)}\.yaml: DDPJob/[^:]+: ([^:]+): ", line)
        if match:
            paths.append(match.group(1))
    return paths


# -- the tests ------------------------------------------------------------------------------
def test_the_cases_cover_the_scenario():
    assert len([case for case in BAD if case.server == REJECTS]) >= 15
    assert {case.server for case in BAD} == {REJECTS, REJECTS_WHEN_STRICT}
    # Every CEL rule of the CRD is shown refusing something, besides the schema's checks.
    assert RULE_MESSAGES <= {problem.message for case in BAD
                             for problem in validation.validate_ddpjob(case.manifest)}


@pytest.mark.parametrize("case", BAD, ids=[case.id for case in BAD])
def test_invalid_ddpjob_is_refused_by_the_api_server_and_by_ddpjob_validate(case, send,
                                                                             cli_verdicts):
    manifest = BAD_MANIFESTS[case.id]
    accepted, status = send(manifest)
    assert not accepted, f"the API server accepted {case.id}; expected a refusal naming {case.api_path}"
    assert status.get("code") in (400, 422), status
    assert case.api_path in named_fields(status), \
        f"the API server's refusal does not name {case.api_path}: {status.get('message')}"

    [problem] = validation.validate_ddpjob(manifest)
    if problem.message in RULE_MESSAGES:  # a CEL rule: the server says the rule's message
        assert problem.message in status["message"], status["message"]
    if case.server == REJECTS_WHEN_STRICT:  # without strict field validation it is pruned
        assert send(manifest, field_validation="Ignore")[0], case.id

    result = cli_verdicts[case.id]
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert ddpjob_validate_paths(result, case.id) == [case.path], result.stderr
    assert case.message in result.stderr


@pytest.mark.parametrize("name", list(GOOD_MANIFESTS))
def test_valid_ddpjob_is_accepted_by_both_with_the_same_defaults(name, send, cli_verdicts):
    manifest = GOOD_MANIFESTS[name]
    accepted, created = send(manifest)
    assert accepted, created.get("message")
    expected, problems = validation.defaulted_manifest(manifest)
    assert problems == []
    # The API server's defaulting (nested objects, lists, int-or-string kept as given) is
    # exactly the one `ddpjob validate`, `render` and the operator apply.
    assert created["spec"] == expected["spec"]

    result = cli_verdicts[name]
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.strip().endswith("is valid"), result.stdout


def test_kubectl_apply_names_each_refused_field(kubectl, cases_namespace, tmp_path):
    """What a user sees: one `kubectl apply` of several bad DDPJobs (client-side apply, strict
    field validation by default) names each field on stderr and exits non-zero."""
    chosen = ["nnodes-zero", "gpu-limit-on-cpu-job", "env-unknown-key", "name-with-dot",
              "volume-names-repeated"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([BAD_MANIFESTS[c] for c in chosen]))
    result = kubectl("apply", "-n", cases_namespace, "--dry-run=server", "-f", str(path),
                     check=False)
    assert result.returncode != 0
    for case in (c for c in BAD if c.id in chosen):
        assert case.api_path in result.stderr, (case.id, result.stderr)
    assert result.stdout.strip() == "", result.stdout


def _table(api_client, namespace: str) -> dict:
    """The server-side Table `kubectl get` prints, with each row's object (one read, so the
    cells and the object agree even if the operator writes status meanwhile)."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    query = [("includeObject", "Object")]
    headers = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    if hasattr(api_client, "param_serialize"):  # the client generated by openapi-generator 7
        method, url, headers, _, _ = api_client.param_serialize(
            "GET", path, query_params=query, header_params=headers, auth_settings=["BearerToken"])
        response = api_client.call_api(method, url, header_params=headers)
        return json.loads(response.read())
    return api_client.call_api(path, "GET", query_params=query, header_params=headers,
                               response_type="object", auth_settings=["BearerToken"],
                               _return_http_data_only=True)


@pytest.mark.kubelet
def test_kubectl_get_shows_the_printer_columns(cluster, kubectl, namespace, crd_installed):
    job = copy.deepcopy(GOOD_MANIFESTS["minimal"])
    job["metadata"] = {"name": "columns", "namespace": namespace}
    job["spec"]["suspend"] = True  # an operator running for other tests starts no pods
    kubectl.apply_yaml(job)
    kubectl("patch", "ddpjob", "columns", "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": "Running", "ready": "1/2", "restarts": 1,
                                         "reason": "ColumnsTest",
                                         "failureHistory": [{"attempt": 0, "nodeRank": 1, "reason": "Error",
                                                             "restartMode": "InPlace",
                                                             "time": "2026-01-01T00:00:00Z"}],
                                         "goodput": {"lastRestartSeconds": 4.5},
                                         "progress": {"summary": "42/100 (42%)", "eta": "1m20s", "step": 42,
                                                      "epoch": 2, "loss": 0.5, "throughput": 80.5}}}))

    header = kubectl("get", "ddpjobs", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "READY", "RESTARTS", "DISRUPTIONS", "PROGRESS", "ETA", "QUEUE", "AGE"]
    wide = kubectl("get", "ddpj", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "PHASE", "READY", "RESTARTS", "DISRUPTIONS", "PROGRESS", "ETA", "EPOCH", "LOSS",
                               "THROUGHPUT", "GOODPUT", "REASON", "LAST-RESTART", "RESTART-TIME", "QUEUE", "AGE"]
    assert wide[1].split()[0] == "columns"

    table = _table(cluster.api_client, namespace)
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns == ["Name", "Phase", "Ready", "Restarts", "Disruptions", "Progress", "ETA", "Epoch", "Loss", "Throughput",
                       "Goodput", "Reason", "Last-Restart", "Restart-Time", "Queue", "Age"]
    [row] = table["rows"]
    cells = dict(zip(columns, row["cells"]))
    status = row["object"].get("status", {})
    assert cells["Name"] == "columns"
    assert (cells["Phase"], cells["Ready"], cells["Restarts"], cells["Reason"]) == (
        status.get("phase"), status.get("ready"), status.get("restarts"), status.get("reason"))
    progress = status.get("progress", {})
    assert progress.get("summary") == "42/100 (42%)"  # kept, whoever wrote the status last
    assert (cells["Progress"], cells["Epoch"], cells["Loss"], cells["Throughput"]) == (
        "42/100 (42%)", 2, 0.5, 80.5)
    history = status.get("failureHistory") or [{}]
    assert (cells["Last-Restart"], cells["Restart-Time"]) == (
        history[0].get("restartMode"), (status.get("goodput") or {}).get("lastRestartSeconds"))
    assert (cells["ETA"] or "") == progress.get("eta", "")  # the operator clears it unless Running
    assert cells["Phase"] in ("Running", "Suspended")  # ours, or the operator's if it runs
    assert re.fullmatch(r"\d+[smhd]", cells["Age"]), cells["Age"]


def test_every_problem_is_named_in_one_answer_by_both(send, tmp_path):
    """Field errors do not hide the rules' verdicts, in the API server as in `ddpjob validate`."""
    manifest, expected = several_problems_case()
    manifest = _sendable(manifest, "several")
    accepted, status = send(manifest)
    assert not accepted
    assert set(expected) <= set(named_fields(status)), status.get("message")
    path = tmp_path / "several.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = subprocess.run([*ddpjob_command(), "validate", "-f", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert sorted(ddpjob_validate_paths(result, "several")) == sorted(expected), result.stderr


UPDATES = update_table()
HOLD = "tests.ddpjob.dev/hold"


@pytest.fixture(scope="module")
def stored_jobs(custom_objects, cases_namespace):
    """The ``old`` object of every update case, stored with the case's status.phase and kept
    out of an operator's hands (should one run for other tests): created suspended (no pods),
    then deleted behind a finalizer of ours, so the operator leaves it alone (it never acts on
    a DDPJob being deleted), then given the case's status. Edits are sent as dry runs.

    An operator that saw a job in the moment between its creation and deletion (an in-cluster
    one on kind is that fast) may still write its own status once, after ours: so the cases'
    statuses are written again until no object has changed for a second."""
    def get(case_id: str) -> dict:
        return custom_objects.get_namespaced_custom_object(GROUP, VERSION, cases_namespace, PLURAL, case_id)

    statuses = {}
    for case in UPDATES:
        body = copy.deepcopy(case.old)
        statuses[case.id] = body.pop("status", None)
        body["metadata"] = {"name": case.id, "namespace": cases_namespace, "finalizers": [HOLD]}
        body["spec"]["suspend"] = True  # no transition rule reads the old suspend
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, cases_namespace, PLURAL, body)
        custom_objects.delete_namespaced_custom_object(GROUP, VERSION, cases_namespace, PLURAL, case.id)
    unsettled, stored = set(statuses), {}
    for _ in range(30):
        for case_id in sorted(unsettled):
            # (None removes a status the operator may have written to a case that has none.)
            custom_objects.patch_namespaced_custom_object_status(
                GROUP, VERSION, cases_namespace, PLURAL, case_id, {"status": statuses[case_id]})
            stored[case_id] = get(case_id)
        time.sleep(1)
        unsettled = {case_id for case_id in unsettled
                     if get(case_id)["metadata"]["resourceVersion"] != stored[case_id]["metadata"]["resourceVersion"]}
        if not unsettled:
            break
    assert not unsettled, f"the stored cases kept changing: {sorted(unsettled)}"
    yield stored
    for case in UPDATES:
        custom_objects.patch_namespaced_custom_object(
            GROUP, VERSION, cases_namespace, PLURAL, case.id, {"metadata": {"finalizers": None}})


@pytest.mark.parametrize("case", UPDATES, ids=[case.id for case in UPDATES])
def test_an_edit_is_judged_alike_by_the_api_server_and_ddpjob_validate(case, custom_objects,
                                                                       cases_namespace, stored_jobs):
    from kubernetes.client.rest import ApiException

    old = stored_jobs[case.id]
    assert (old.get("status") or {}).get("phase", "") == (case.old.get("status") or {}).get("phase", "")
    new = copy.deepcopy(case.new)
    new["metadata"] = {**old["metadata"]}  # name, resourceVersion, finalizers
    try:
        custom_objects.replace_namespaced_custom_object(GROUP, VERSION, cases_namespace, PLURAL, case.id,
                                                        new, dry_run="All", field_validation="Strict")
        accepted, status = True, {}
    except ApiException as error:
        accepted, status = False, json.loads(error.body)
    problems = validation.validate_ddpjob(case.new, old)
    if case.path is None:
        assert accepted, status.get("message")
        assert problems == []
    else:
        assert not accepted, f"the API server accepted {case.id}"
        assert named_fields(status) == [case.path], status.get("message")
        assert case.message in status["message"]
        assert [p.path for p in problems] == [case.path]
