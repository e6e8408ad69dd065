"""End-to-end against the real Kueue (v0.17.0, built by scripts/build-kueue.sh): a DDPJob that
names a LocalQueue runs only when its whole gang fits the ClusterQueue's quota (docs/kueue.md).

Each test gets its own ResourceFlavor, ClusterQueue and LocalQueue (cluster-scoped names carry
the namespace), so the quota of one test never admits another's jobs.
"""
from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from ddpjob.controller import kueue as kueue_api
from tests.testbed.operator_runner import OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    EXAMPLES, ONE_THREAD_ENV, TINY_TRAINING_ARGS, PodRecorder, as_user, checkpoint_steps, ddpjob_manifest,
    e2e, gate_command, grant, hostpath_volume, kill_training_worker, open_gate, trainer_events, user_name,
    wait_until_allowed,
)

pytestmark = [pytest.mark.cluster, pytest.mark.kueue]
TIMEOUT = 240
TRAINING_TIMEOUT = 400
GROUP = kueue_api.GROUP


@pytest.fixture(scope="module")
def kueue(cluster):
    """Kueue's controller manager on the local test bed for this module's tests."""
    if cluster.testbed is None:
        pytest.skip("the Kueue tests start Kueue as a host process: they need the local test bed")
    from tests.testbed.kueue import Kueue, kueue_folder

    try:
        folder = kueue_folder()
    except RuntimeError as error:
        pytest.skip(f"Kueue could not be built (scripts/build-kueue.sh): {error}")
    handle = Kueue(folder, cluster.testbed.control_plane, cluster.kubectl, cluster.run_dir,
                   cluster.testbed.pidfile)
    try:
        handle.start()
        yield handle
    finally:
        handle.stop()


def operator_watches_workloads(cluster) -> bool:
    """The operator (a ServiceAccount, so in the audit log) has listed or watched Workloads."""
    log = cluster.testbed.control_plane.audit_log
    for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
        if "/apis/kueue.x-k8s.io/v1beta2/workloads" in line and "ddpjob-operator" in line:
            return True
    return False


@pytest.fixture
def watched(e2e, kueue, cluster):
    """The operator serves Workloads. kopf rescans the API after each CRD event; when the last
    Kueue CRD became discoverable only after the last such event, it has not seen Workloads
    yet (docs/kueue.md: install Kueue first, or restart the operator). One more CRD event
    makes it look again, as an administrator's restart would."""
    def seen() -> bool:
        if operator_watches_workloads(cluster):
            return True
        cluster.kubectl("annotate", "crd", f"workloads.{GROUP}", "--overwrite",
                        f"ddpjob.dev/testbed-rescan={secrets.token_hex(4)}")
        return False

    cluster.wait_for(seen, 60, "the operator watching Workloads", interval=2)


@pytest.fixture
def queue(e2e, kueue, watched):
    """A LocalQueue ``<ns>`` in the test's namespace, pointing at its own ClusterQueue with
    ``cpu`` quota (set by the test through ``queue.make(cpu=...)``); removed afterwards."""
    created: list[tuple[str, str]] = []

    class Queue:
        name = "team"
        cluster_queue = f"cq-{e2e.namespace}"

        def make(self, cpu: str, preemption: bool = False, flavor_spec: dict | None = None) -> "Queue":
            flavor = f"flavor-{e2e.namespace}"
            cq_spec = {
                "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                    {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpu}]}]}],
            }
            if preemption:
                cq_spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
            objects = [
                {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor},
                 **({"spec": flavor_spec} if flavor_spec else {})},
                {"apiVersion": f"{GROUP}/v1beta2", "kind": "ClusterQueue",
                 "metadata": {"name": self.cluster_queue}, "spec": cq_spec},
                {"apiVersion": f"{GROUP}/v1beta2", "kind": "LocalQueue",
                 "metadata": {"name": self.name, "namespace": e2e.namespace},
                 "spec": {"clusterQueue": self.cluster_queue}},
            ]
            e2e.cluster.kubectl.apply_yaml(objects)
            created.extend([("resourceflavor", flavor), ("clusterqueue", self.cluster_queue)])
            e2e.cluster.wait_for(lambda: _condition(_get(e2e, "clusterqueue", self.cluster_queue), "Active"),
                                 60, f"ClusterQueue {self.cluster_queue} Active")
            e2e.cluster.wait_for(lambda: _condition(_get(e2e, "localqueue", self.name, e2e.namespace), "Active"),
                                 60, f"LocalQueue {self.name} Active")
            return self

        def priority_class(self, name: str, value: int) -> str:
            full = f"{name}-{e2e.namespace}"
            e2e.cluster.kubectl.apply_yaml({"apiVersion": f"{GROUP}/v1beta2", "kind": "WorkloadPriorityClass",
                                            "metadata": {"name": full}, "value": value})
            created.append(("workloadpriorityclass", full))
            return full

    yield Queue()
    e2e.cluster.kubectl("delete", "ddpjobs", "--all", "-n", e2e.namespace, "--wait=true", check=False)
    for kind, name in reversed(created):
        e2e.cluster.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)


def _get(e2e, kind: str, name: str, namespace: str | None = None) -> dict:
    args = ["get", f"{kind}.{GROUP}", name, "-o", "json"] + (["-n", namespace] if namespace else [])
    result = e2e.cluster.kubectl(*args, check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def _condition(obj: dict, type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or ())


def workload(e2e, job: str) -> dict:
    return _get(e2e, "workload", f"ddpjob-{job}", e2e.namespace)


def queued_manifest(e2e, name: str, queue: str, *, cpu: str = "1", priority: str | None = None,
                    **fields) -> dict:
    manifest = ddpjob_manifest(name, e2e.image, resources={"requests": {"cpu": cpu}}, **fields)
    labels = {kueue_api.QUEUE_LABEL: queue}
    if priority:
        labels[kueue_api.PRIORITY_LABEL] = priority
    manifest["metadata"]["labels"] = labels
    return manifest


def gated_job(e2e, name: str, queue: str, host_dir: str, **fields) -> dict:
    """Two nodes that wait for the test to create ``<host_dir>/<name>/go``, then succeed."""
    folder = Path(host_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    return queued_manifest(
        e2e, name, queue, command=gate_command("/gate", timeout_seconds=TRAINING_TIMEOUT),
        volumeMounts=[{"name": "gate", "mountPath": "/gate"}],
        template={"spec": {"volumes": [hostpath_volume("gate", str(folder))]}}, **fields)


def start_checkpointed(e2e, queue, ckpt: Path, *, epochs: int, grace: int, **fields) -> None:
    """The queued job "train": the trainer with a checkpoint every 20 steps in ``ckpt``, once
    admitted, Running and past its first checkpoint."""
    e2e.create(queued_manifest(
        e2e, "train", queue.name, env=ONE_THREAD_ENV,
        args=[*TINY_TRAINING_ARGS, "--fake-size=3200", "--batch-size=16", f"--epochs={epochs}",
              "--log-every=20", "--checkpoint-dir=/checkpoints", "--checkpoint-every=20"],
        volumeMounts=[{"name": "checkpoints", "mountPath": "/checkpoints"}],
        template={"spec": {"volumes": [hostpath_volume("checkpoints", str(ckpt))],
                           "terminationGracePeriodSeconds": grace}}, **fields))
    e2e.wait_for_phase("train", "Running", TIMEOUT)
    e2e.cluster.wait_for(lambda: checkpoint_steps(e2e, str(ckpt), "train-node-0", "/checkpoints"),
                         TRAINING_TIMEOUT, "the first checkpoint", interval=0.2)


def test_two_jobs_compete_for_a_quota_of_one_gang(e2e, queue, shared_host_dir):
    """Quota for one 2-node gang: the second job creates no pod and says it is queued, until
    the first finishes and gives its quota back; then it runs."""
    queue.make(cpu="2")
    e2e.create(gated_job(e2e, "first", queue.name, shared_host_dir))
    e2e.wait_for_phase("first", "Running", TIMEOUT)
    # every pod ready: the Workload says so, as waitForPodsReady needs (Kueue reads only this)
    e2e.cluster.wait_for(lambda: _condition(workload(e2e, "first"), "PodsReady"), TIMEOUT,
                         "PodsReady True on the first job's Workload", interval=0.2)
    ready, = [c for c in workload(e2e, "first")["status"]["conditions"] if c["type"] == "PodsReady"]
    assert ready["reason"] == "Started", ready
    with PodRecorder(e2e, "second") as second_pods:
        e2e.create(gated_job(e2e, "second", queue.name, shared_host_dir))
        queued = e2e.wait_for_status(
            "second", lambda s: s.get("phase") == "Queued" and "quota" in s.get("message", ""),
            TIMEOUT, "Queued for quota")
        assert queued["reason"] == "Queued", queued
        assert "LocalQueue team" in queued["message"], queued
        wide = e2e.cluster.kubectl("get", "ddpjobs", "-n", e2e.namespace, "-o", "wide").stdout
        header, *rows = [line.split() for line in wide.splitlines()]
        assert "QUEUE" in header, wide
        assert {row[0]: (row[1], "team" in row) for row in rows} == {
            "first": ("Running", True), "second": ("Queued", True)}, wide
        assert not e2e.pods("second")

        open_gate(e2e, str(Path(shared_host_dir) / "first"), "first-node-0", "/gate")
        assert e2e.wait_until_finished("first", TIMEOUT)["phase"] == "Succeeded"
        assert _condition(workload(e2e, "first"), "Finished"), workload(e2e, "first")
        e2e.wait_for_phase("second", "Running", TIMEOUT)
        open_gate(e2e, str(Path(shared_host_dir) / "second"), "second-node-0", "/gate")
        status = e2e.wait_until_finished("second", TIMEOUT)
        seen = second_pods.describe()
    assert status["phase"] == "Succeeded", (status, seen)
    # No pod of the second job existed before the first had finished: one attempt, one gang.
    assert second_pods.pods_per_rank(status["restartAttempt"]) == {0: 1, 1: 1}, seen
    assert len(second_pods.snapshot()) == 2, seen
    assert e2e.wait_for_event("second", "Admitted")


def test_a_job_larger_than_the_whole_quota_says_so_and_creates_nothing(e2e, queue):
    queue.make(cpu="2")
    with PodRecorder(e2e, "huge") as pods:
        e2e.create(queued_manifest(e2e, "huge", queue.name, nnodes=3, command=["true"]))
        status = e2e.wait_for_status(
            "huge", lambda s: s.get("phase") == "Queued" and "insufficient quota" in s.get("message", ""),
            TIMEOUT, "Queued: insufficient quota")
        wl = workload(e2e, "huge")
    assert "3 pod(s) as one unit" in status["message"], status
    assert "maximum capacity" in status["message"], status  # Kueue's own words: it can never fit
    assert wl["spec"]["podSets"][0]["count"] == 3 and not _condition(wl, "QuotaReserved"), wl
    assert not pods.snapshot() and e2e.service("huge") is None


OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"
GUARD = "ValidatingAdmissionPolicy 'ddpjob-operator-owned-children'"


def test_the_operator_may_write_only_workloads_a_ddpjob_controls(e2e, queue):
    """Its ClusterRole lets the operator create any Workload and write any Workload's status;
    manifests/admission-policy.yaml limits both to Workloads a DDPJob controls (the other
    tests show its own pass)."""
    queue.make(cpu="1")
    kubectl = e2e.cluster.kubectl
    stray = {"apiVersion": f"{GROUP}/v1beta2", "kind": "Workload",
             "metadata": {"name": "stray", "namespace": e2e.namespace},
             "spec": {"queueName": queue.name, "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                 "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": e2e.image,
                                 "resources": {"requests": {"cpu": "100m"}}}]}}}]}}

    def create_as_operator():
        return kubectl(f"--as={OPERATOR_USER}", "create", "-f", "-", input=json.dumps(stray), check=False)

    e2e.cluster.wait_for(lambda: GUARD in create_as_operator().stderr, 30, "the policy to refuse a stray Workload")
    refused = create_as_operator()
    assert refused.returncode != 0, refused.stdout
    assert "may create only workloads that a DDPJob controls" in refused.stderr, refused.stderr

    kubectl("create", "-f", "-", input=json.dumps(stray))  # someone else's Workload
    finished = {"status": {"conditions": [{"type": "Finished", "status": "True", "reason": "Succeeded",
                                           "message": "not the operator's", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    # The operator's own request: a merge PATCH of the status, without a GET first (it has no
    # get on workloads/status, so `kubectl patch` could not even try).
    as_operator = client.ApiClient(e2e.cluster.api_client.configuration)
    as_operator.set_default_header("Impersonate-User", OPERATOR_USER)
    with pytest.raises(client.ApiException) as refused_patch:
        client.CustomObjectsApi(as_operator).patch_namespaced_custom_object_status(
            GROUP, "v1beta2", e2e.namespace, "workloads", "stray", finished)
    assert refused_patch.value.status == 403, refused_patch.value
    assert GUARD in refused_patch.value.body, refused_patch.value.body
    assert "may update only workloads that a DDPJob controls" in refused_patch.value.body
    assert not _condition(_get(e2e, "workload", "stray", e2e.namespace), "Finished")


def test_deleting_a_queued_job_removes_its_workload(e2e, queue, shared_host_dir):
    queue.make(cpu="2")
    e2e.create(gated_job(e2e, "holder", queue.name, shared_host_dir))
    e2e.wait_for_phase("holder", "Running", TIMEOUT)
    with PodRecorder(e2e, "waiter") as waiter_pods:
        e2e.create(gated_job(e2e, "waiter", queue.name, shared_host_dir))
        e2e.wait_for_phase("waiter", "Queued", TIMEOUT)
        e2e.cluster.wait_for(lambda: workload(e2e, "waiter"), 30, "the waiter's Workload")
        e2e.delete_job("waiter")
        e2e.cluster.wait_for(lambda: not workload(e2e, "waiter"), 60, "the waiter's Workload deleted")
    assert not waiter_pods.snapshot()  # never a pod, not even for a moment
    # The running job is untouched, and still finishes.
    open_gate(e2e, str(Path(shared_host_dir) / "holder"), "holder-node-0", "/gate")
    assert e2e.wait_until_finished("holder", TIMEOUT)["phase"] == "Succeeded"


def test_the_queue_label_stays_on_a_waiting_and_on_an_admitted_job(e2e, queue, shared_host_dir):
    """Issue 21, item 8: the job's owner takes the queue label off a waiting job (it would
    start ahead of the queue at the operator's next look, which a spec edit brings) and off
    an admitted one (its admitted Workload would be left holding the quota). Both are
    refused (manifests/queue-label-policy.yaml), and the queue holds."""
    queue.make(cpu="2")
    e2e.create(gated_job(e2e, "holder", queue.name, shared_host_dir))
    e2e.wait_for_phase("holder", "Running", TIMEOUT)
    kubectl = e2e.cluster.kubectl
    owner = user_name("job-owner")
    grant(kubectl, e2e.namespace, owner, "job-owner", [{
        "apiGroups": ["ddpjob.dev"], "resources": ["ddpjobs"], "verbs": ["get", "list", "patch"]}])
    wait_until_allowed(e2e.cluster, owner, "patch", "ddpjobs", e2e.namespace)
    with PodRecorder(e2e, "waiter") as waiter_pods:
        e2e.create(gated_job(e2e, "waiter", queue.name, shared_host_dir))
        e2e.wait_for_status("waiter", lambda s: s.get("phase") == "Queued" and "quota" in s.get("message", ""),
                            TIMEOUT, "Queued for quota")
        for job in ("waiter", "holder"):
            removed = as_user(kubectl, owner, "patch", "ddpjob", job, "-n", e2e.namespace, "--type=merge",
                              "-p", json.dumps({"metadata": {"labels": {kueue_api.QUEUE_LABEL: None}}}))
            assert removed.returncode != 0, (job, removed.stdout)
            assert "ValidatingAdmissionPolicy 'ddpjob-queue-label'" in removed.stderr, removed.stderr
            assert f"this edit removes it ({queue.name})" in removed.stderr, removed.stderr
        e2e.patch_spec("waiter", {"activeDeadlineSeconds": 3600})  # the operator looks again
        for _ in range(10):
            waiting = e2e.status("waiter")
            assert waiting.get("phase") == "Queued" and not waiter_pods.snapshot(), (
                waiting, waiter_pods.describe())
            time.sleep(0.5)
    holder = workload(e2e, "holder")
    assert _condition(holder, "Admitted") and not _condition(holder, "Finished"), holder
    assert e2e.status("holder")["phase"] == "Running"


def test_the_admitted_flavor_places_the_gang_on_its_node_pool(e2e, queue, nodes):
    """A ResourceFlavor with nodeLabels and tolerations (a tainted node pool): the admitted
    gang's pods get both and run on that pool."""
    pool = f"pool-{secrets.token_hex(3)}"
    label = {"ddpjob.dev/testbed-pool": pool}
    taint = {"key": "ddpjob.dev/testbed-pool", "value": pool, "effect": "NoSchedule"}
    toleration = {"key": taint["key"], "operator": "Equal", "value": pool, "effect": "NoSchedule"}
    nodes.add(pool, cpu="4", labels=label, taints=[taint])
    try:
        queue.make(cpu="2", flavor_spec={"nodeLabels": label, "tolerations": [toleration]})
        e2e.create(queued_manifest(e2e, "placed", queue.name, command=["true"]))
        status = e2e.wait_until_finished("placed", TIMEOUT)
        pods = e2e.pods("placed")
    finally:
        nodes.remove(pool)
    assert status["phase"] == "Succeeded", status
    assert len(pods) == 2, pods
    for pod in pods:
        assert pod["spec"]["nodeName"] == pool, pod["spec"]
        assert pod["spec"]["nodeSelector"] == label
        assert toleration in pod["spec"]["tolerations"]


def test_preemption_stops_the_gang_gracefully_and_it_resumes_from_its_checkpoint(e2e, queue, shared_host_dir):
    """A higher-priority job evicts a training job: its pods get SIGTERM and save a
    checkpoint, it waits in the queue (no restart counted), and once the other job has
    finished it is admitted again and resumes from that checkpoint."""
    queue.make(cpu="2", preemption=True)
    low, high = queue.priority_class("low", 100), queue.priority_class("high", 1000)
    ckpt = Path(shared_host_dir) / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    total_steps = 400
    start_checkpointed(e2e, queue, ckpt, epochs=4, grace=30, priority=low)
    first_pod_uid = e2e.pod("train-node-0")["metadata"]["uid"]

    e2e.create(gated_job(e2e, "urgent", queue.name, shared_host_dir, priority=high))
    preempted = e2e.wait_for_status("train", lambda s: s.get("reason") == "Preempted", TIMEOUT, "Preempted")
    assert preempted["phase"] == "Queued", preempted
    e2e.wait_for_phase("urgent", "Running", TIMEOUT)
    # The preempted gang stopped on SIGTERM and saved a checkpoint on its way out.
    log = e2e.cluster.testbed.pod_log_path(e2e.namespace, "train-node-0", first_pod_uid).read_text()
    stopped = re.search(r"stopped by signal 15 at step=(\d+)/\d+; checkpoint (\S+) saved", log)
    assert stopped, log[-3000:]
    assert not e2e.pods("train"), e2e.pod_summary("train")

    open_gate(e2e, str(Path(shared_host_dir) / "urgent"), "urgent-node-0", "/gate")
    assert e2e.wait_until_finished("urgent", TIMEOUT)["phase"] == "Succeeded"
    status = e2e.wait_until_finished("train", TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0 and status["restartAttempt"] == 1, status
    log = e2e.wait_for_logs("train-node-0", "ddptrain: done")
    start, = trainer_events(log, "start")
    resumed_at = int(start["step"])
    # ... from the checkpoint saved on SIGTERM, not an older periodic one.
    assert resumed_at == int(stopped.group(1)) > 0, (stopped.group(0), log[-3000:])
    assert f"resumed from {stopped.group(2)} at step={resumed_at}" in log, log[-3000:]
    done, = trainer_events(log, "done")
    assert int(done["step"]) == int(done["total_steps"]) == total_steps, done
    assert _condition(workload(e2e, "train"), "Finished")


def test_an_in_place_restart_keeps_the_admission_and_pods_ready_recovers(e2e, queue, shared_host_dir):
    """A killed rank of an admitted job: the same pods restart in place under the same
    Workload, never queued again; its PodsReady goes True (Started), False (WaitForRecovery)
    and True (Recovered), which is what waitForPodsReady's recoveryTimeout reads."""
    queue.make(cpu="2")
    ckpt = Path(shared_host_dir) / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    start_checkpointed(e2e, queue, ckpt, epochs=2, grace=5, failurePolicy={"maxRestarts": 1})
    e2e.cluster.wait_for(lambda: _condition(workload(e2e, "train"), "PodsReady"), TIMEOUT,
                         "PodsReady True", interval=0.2)
    admitted = workload(e2e, "train")
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in e2e.pods("train")}
    reasons: list[str] = []

    def pods_ready_reason() -> str:  # the client, not kubectl: a poll every ~0.1 s
        current = e2e.custom.get_namespaced_custom_object(
            kueue_api.GROUP, kueue_api.VERSION, e2e.namespace, kueue_api.WORKLOAD_PLURAL, "ddpjob-train")
        found = [c for c in (current.get("status") or {}).get("conditions") or () if c["type"] == "PodsReady"]
        reason = f"{found[0]['status']}/{found[0]['reason']}" if found else "-"
        if not reasons or reasons[-1] != reason:
            reasons.append(reason)
        return reason

    e2e.cluster.wait_for(lambda: kill_training_worker(e2e, "train", node_rank=1), 30,
                         "node 1's training process to kill", interval=0.1)
    e2e.cluster.wait_for(lambda: pods_ready_reason() == "True/Recovered", TRAINING_TIMEOUT,
                         "PodsReady True again, reason Recovered", interval=0.1)
    status = e2e.wait_until_finished("train", TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded" and status["restarts"] == 1, status
    assert status["failureHistory"][0]["restartMode"] == "InPlace", status
    after = workload(e2e, "train")
    assert after["metadata"]["uid"] == admitted["metadata"]["uid"]  # the same admission
    assert not _condition(after, "Evicted") and not _condition(after, "Requeued"), after
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in e2e.pods("train")} == pods
    assert "False/WaitForRecovery" in reasons, reasons  # seen between the kill and the recovery


def test_the_example_file_is_admitted_by_the_real_kueue(e2e, kueue, watched):
    """examples/ddpjob-kueue.yaml as a user applies it (its cluster-scoped names suffixed with
    the test's namespace, so no other test's quota is touched): Kueue accepts its objects and
    admits the DDPJob as one unit, and the operator creates the whole gang. The pods stay
    Pending here (the example's ReadWriteMany claim has no provisioner on the test bed)."""
    documents = list(yaml.safe_load_all((EXAMPLES / "ddpjob-kueue.yaml").read_text()))
    suffix = f"-{e2e.namespace}"
    renamed = {}
    for doc in documents:
        if doc["kind"] in ("ResourceFlavor", "ClusterQueue", "WorkloadPriorityClass"):
            renamed[doc["metadata"]["name"]] = doc["metadata"]["name"] + suffix
            doc["metadata"]["name"] += suffix
        else:
            doc["metadata"]["namespace"] = e2e.namespace
    [job] = [doc for doc in documents if doc["kind"] == "DDPJob"]
    [cluster_queue] = [doc for doc in documents if doc["kind"] == "ClusterQueue"]
    [local_queue] = [doc for doc in documents if doc["kind"] == "LocalQueue"]
    for group in cluster_queue["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            flavor["name"] = renamed[flavor["name"]]
    local_queue["spec"]["clusterQueue"] = renamed[local_queue["spec"]["clusterQueue"]]
    labels = job["metadata"]["labels"]
    labels[kueue_api.PRIORITY_LABEL] = renamed[labels[kueue_api.PRIORITY_LABEL]]
    name, nnodes = job["metadata"]["name"], job["spec"]["nnodes"]
    try:
        e2e.cluster.kubectl.apply_yaml(documents)
        e2e.cluster.wait_for(lambda: _condition(workload(e2e, name), "Admitted"), TIMEOUT,
                             "the example's Workload admitted")
        e2e.cluster.wait_for(lambda: len(e2e.pods(name)) == nnodes, TIMEOUT, "the example's whole gang")
        admitted = workload(e2e, name)
        assert admitted["spec"]["podSets"][0]["count"] == nnodes, admitted["spec"]
        assert admitted["spec"]["priorityClassRef"]["name"] == renamed["batch"], admitted["spec"]
        assert admitted["spec"]["priority"] == 100, admitted["spec"]  # the example's class "batch"
        assert admitted["spec"]["queueName"] == local_queue["metadata"]["name"], admitted["spec"]
        assert e2e.wait_for_event(name, "Admitted")
    finally:
        e2e.cluster.kubectl("delete", "ddpjobs", "--all", "-n", e2e.namespace, "--wait=true", check=False)
        for doc in reversed(documents):
            if doc["kind"] in ("ResourceFlavor", "ClusterQueue", "WorkloadPriorityClass"):
                e2e.cluster.kubectl("delete", f"{doc['kind'].lower()}.{GROUP}", doc["metadata"]["name"],
                                    "--ignore-not-found", "--wait=false", check=False)


def test_a_queued_job_edited_to_another_shape_is_admitted_in_its_new_shape(e2e, queue, shared_host_dir):
    """Issue 21, item 7: nnodes of a waiting job edited from 1 to 2. Its Workload was built
    for 1 pod; the operator builds a new one for 2 (the job queues again), and the pods
    created are exactly what Kueue admitted: never 2 pods on an admission of 1."""
    queue.make(cpu="2")
    e2e.create(gated_job(e2e, "holder", queue.name, shared_host_dir))
    e2e.wait_for_phase("holder", "Running", TIMEOUT)
    with PodRecorder(e2e, "waiter") as waiter_pods:
        e2e.create(queued_manifest(e2e, "waiter", queue.name, nnodes=1, command=["true"]))
        e2e.wait_for_status("waiter", lambda s: s.get("phase") == "Queued" and "quota" in s.get("message", ""),
                            TIMEOUT, "Queued for quota")
        first = workload(e2e, "waiter")
        assert first["spec"]["podSets"][0]["count"] == 1, first["spec"]
        e2e.patch_spec("waiter", {"nnodes": 2})
        e2e.cluster.wait_for(
            lambda: (lambda wl: wl and wl["metadata"]["uid"] != first["metadata"]["uid"]
                     and wl["spec"]["podSets"][0]["count"] == 2)(workload(e2e, "waiter")),
            60, "a new Workload of 2 pods for the waiter")
        assert not waiter_pods.snapshot()
        open_gate(e2e, str(Path(shared_host_dir) / "holder"), "holder-node-0", "/gate")
        assert e2e.wait_until_finished("holder", TIMEOUT)["phase"] == "Succeeded"
        status = e2e.wait_until_finished("waiter", TIMEOUT)
        admitted = workload(e2e, "waiter")
        seen = waiter_pods.describe()
    assert status["phase"] == "Succeeded", (status, seen)
    assert admitted["spec"]["podSets"][0]["count"] == 2 and _condition(admitted, "Admitted"), admitted
    assert waiter_pods.pods_per_rank(status["restartAttempt"]) == {0: 1, 1: 1}, seen
    assert len(waiter_pods.snapshot()) == 2, seen


def one_runs_one_waits(e2e, queue, host_dir: str, running: str, waiting: str) -> None:
    """Quota for one 2-node gang: ``running`` admitted and Running, ``waiting`` Queued for quota."""
    queue.make(cpu="2")
    e2e.create(gated_job(e2e, running, queue.name, host_dir))
    e2e.wait_for_phase(running, "Running", TIMEOUT)
    e2e.create(gated_job(e2e, waiting, queue.name, host_dir))
    e2e.wait_for_status(waiting, lambda s: s.get("phase") == "Queued" and "quota" in s.get("message", ""),
                        TIMEOUT, "Queued for quota")


def test_an_admitted_job_taken_out_of_its_queue_gives_its_quota_back(e2e, queue, shared_host_dir):
    """Issue 21, item 8: the queue label removed from an admitted job (by an administrator,
    with spec.suspend: true in the same edit, which is what ddpjob-queue-label allows): once
    its gang has stopped the operator gives its Workload up, and the quota it held admits the
    job waiting behind it."""
    one_runs_one_waits(e2e, queue, shared_host_dir, "holder", "waiter")
    holder_workload = workload(e2e, "holder")
    assert _condition(holder_workload, "Admitted"), holder_workload
    e2e.custom.patch_namespaced_custom_object(
        "ddpjob.dev", "v1alpha1", e2e.namespace, "ddpjobs", "holder",
        {"metadata": {"labels": {kueue_api.QUEUE_LABEL: None}}, "spec": {"suspend": True}})
    e2e.wait_for_phase("holder", "Suspended", TIMEOUT)
    e2e.cluster.wait_for(lambda: not workload(e2e, "holder"), 60, "the holder's Workload given up")
    e2e.wait_for_phase("waiter", "Running", TIMEOUT)
    assert _condition(workload(e2e, "waiter"), "Admitted"), workload(e2e, "waiter")


def test_a_suspended_admitted_job_gives_its_quota_back_and_queues_again_when_resumed(
        e2e, queue, shared_host_dir):
    """Issue 21: spec.suspend on an admitted job (its label kept): once the gang has stopped
    its Workload is given up, so the job waiting behind it is admitted; resumed, the suspended
    job queues again with a new Workload and runs when the quota is free."""
    one_runs_one_waits(e2e, queue, shared_host_dir, "pauser", "next")
    first = workload(e2e, "pauser")
    e2e.custom.patch_namespaced_custom_object(
        "ddpjob.dev", "v1alpha1", e2e.namespace, "ddpjobs", "pauser", {"spec": {"suspend": True}})
    e2e.wait_for_phase("pauser", "Suspended", TIMEOUT)
    e2e.cluster.wait_for(lambda: not workload(e2e, "pauser"), 60, "the suspended job's Workload given up")
    e2e.wait_for_phase("next", "Running", TIMEOUT)
    e2e.custom.patch_namespaced_custom_object(
        "ddpjob.dev", "v1alpha1", e2e.namespace, "ddpjobs", "pauser", {"spec": {"suspend": False}})
    e2e.wait_for_status("pauser", lambda s: s.get("phase") == "Queued", TIMEOUT, "queued again")
    again = e2e.cluster.wait_for(lambda: workload(e2e, "pauser"), 60, "a new Workload")
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    open_gate(e2e, str(Path(shared_host_dir) / "next"), "next-node-0", "/gate")
    assert e2e.wait_until_finished("next", TIMEOUT)["phase"] == "Succeeded"
    e2e.wait_for_phase("pauser", "Running", TIMEOUT)


def test_with_the_setting_an_unlabelled_job_queues_in_the_default_local_queue(e2e, queue, operator):
    """Issue 21, item 9: with DDPJOB_OPERATOR_MANAGE_JOBS_WITHOUT_QUEUE_NAME=true a DDPJob
    without the queue label waits in the LocalQueue ``default`` of its namespace: a gang
    larger than that queue's quota never gets a pod."""
    queue.name = "default"  # the name Kueue's LocalQueueDefaulting uses
    queue.make(cpu="1")
    operator.extra_env["DDPJOB_OPERATOR_MANAGE_JOBS_WITHOUT_QUEUE_NAME"] = "true"
    try:
        operator.restart()
        with PodRecorder(e2e, "unlabelled") as pods:
            e2e.create(ddpjob_manifest("unlabelled", e2e.image, resources={"requests": {"cpu": "1"}},
                                       command=["true"]))
            status = e2e.wait_for_status(
                "unlabelled", lambda s: s.get("phase") == "Queued" and "insufficient quota" in s.get("message", ""),
                TIMEOUT, "Queued in the default LocalQueue")
            wl = workload(e2e, "unlabelled")
            time.sleep(2)
            assert not pods.snapshot(), pods.describe()
        assert "LocalQueue default" in status["message"], status
        assert wl["spec"]["queueName"] == "default" and wl["spec"]["podSets"][0]["count"] == 2, wl["spec"]
    finally:
        e2e.cluster.kubectl("delete", "ddpjobs", "--all", "-n", e2e.namespace, "--wait=true", check=False)
        operator.extra_env.pop("DDPJOB_OPERATOR_MANAGE_JOBS_WITHOUT_QUEUE_NAME", None)
        operator.restart()


def test_only_the_workload_the_job_owns_counts(e2e, queue):
    """Issue 21, item 10: a Workload labelled with the job's name but not the job's (no
    ownerReference: ddpjob-ownership keeps those to the operator) exists before the job.
    The job gets its own Workload and runs on that one's admission; the other is never
    deleted or patched."""
    queue.make(cpu="3")
    decoy = {"apiVersion": f"{GROUP}/v1beta2", "kind": "Workload",
             "metadata": {"name": "decoy", "namespace": e2e.namespace,
                          "labels": {"ddpjob.dev/job-name": "owned"}},
             "spec": {"queueName": queue.name, "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                 "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": e2e.image,
                                 "resources": {"requests": {"cpu": "100m"}}}]}}}]}}
    e2e.cluster.kubectl("create", "-f", "-", input=json.dumps(decoy))
    e2e.cluster.wait_for(lambda: _condition(_get(e2e, "workload", "decoy", e2e.namespace), "Admitted"),
                         60, "the decoy admitted")
    before = _get(e2e, "workload", "decoy", e2e.namespace)
    e2e.create(queued_manifest(e2e, "owned", queue.name, command=["true"]))
    status = e2e.wait_until_finished("owned", TIMEOUT)
    assert status["phase"] == "Succeeded", status
    own = workload(e2e, "owned")
    assert own["metadata"]["ownerReferences"][0]["uid"] == e2e.job("owned")["metadata"]["uid"], own
    assert _condition(own, "Finished"), own
    after = _get(e2e, "workload", "decoy", e2e.namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"], after
    assert not _condition(after, "Finished") and _condition(after, "Admitted"), after
