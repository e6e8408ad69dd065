"""Kueue admission (docs/kueue.md): the Workload a queued DDPJob gets, when its gang may run,
and what the operator writes back to Kueue. Pure functions, and reconcile passes on a fake API."""
from __future__ import annotations

import datetime as dt

import pytest

from ddpjob.api import names, spec
from ddpjob.api.status import JobStatus
from ddpjob.controller import kueue
from ddpjob.controller.reconcile import JobMemory, reconcile
from tests.support.jobs import UID, pod_view
from tests.unit.test_handlers import SETTINGS, FakeKube

pytestmark = pytest.mark.unit

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
QUEUE = {kueue.QUEUE_LABEL: "team-a"}


def job(nnodes: int = 2, labels=QUEUE, **fields) -> spec.DDPJob:
    return spec.DDPJob(name="train", namespace="ns", uid=UID, labels=dict(labels or {}),
                       spec=spec.DDPJobSpec(nnodes=nnodes, image="img",
                                            resources={"requests": {"cpu": "1"}}, **fields))


def cond(type_: str, status: bool, reason: str = "R", message: str = "") -> dict:
    return {"type": type_, "status": "True" if status else "False", "reason": reason,
            "message": message, "lastTransitionTime": "2025-01-01T11:00:00Z"}


def workload(*conditions: dict, admission: bool = False, owner: str | None = UID) -> dict:
    meta = {"name": "ddpjob-train", "namespace": "ns", "uid": "wl-uid", "generation": 1,
            "resourceVersion": "42", "labels": {names.LABEL_JOB_NAME: "train"}}
    if owner:
        meta["ownerReferences"] = [{"kind": names.KIND, "uid": owner, "controller": True}]
    status = {"conditions": list(conditions)}
    if admission:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [{"name": "node", "count": 2}]}
    return {"metadata": meta, "status": status}


PENDING = kueue.view_workload(workload(cond("QuotaReserved", False, "Pending",
                                             "couldn't assign flavors to pod set node: insufficient quota")))
ADMITTED = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True))
EVICTED = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True),
                                       cond("Evicted", True, "Preempted", "Preempted to accommodate a workload"),
                                       admission=True))


def test_the_workload_asks_for_the_whole_gang_as_one_pod_set_owned_by_the_job():
    wl = kueue.build_workload(job(nnodes=3))
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["spec"]["queueName"] == "team-a"
    [pod_set] = wl["spec"]["podSets"]
    assert pod_set["count"] == 3
    assert pod_set["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1"}
    assert wl["metadata"]["ownerReferences"][0]["uid"] == UID
    assert wl["metadata"]["labels"] == {names.LABEL_JOB_NAME: "train"}
    assert "priorityClassRef" not in wl["spec"]


def test_a_priority_class_label_names_the_workload_priority_class_with_its_value():
    wl = kueue.build_workload(job(labels={**QUEUE, kueue.PRIORITY_LABEL: "high"}), priority=1000)
    assert wl["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                              "name": "high"}
    assert wl["spec"]["priority"] == 1000


@pytest.mark.parametrize("the_job, wl, expected", [
    (job(labels=None), None, None),                     # no queue: Kueue is not involved
    (job(), None, "Queued"),                            # Workload not there yet
    (job(), PENDING, "Queued"),                         # waiting for quota
    (job(), ADMITTED, None),                            # admitted: the gang may run
    (job(), EVICTED, "Preempted"),                      # preempted: stop the gang
    (job(), kueue.view_workload(workload(cond("Admitted", True), owner="other")), "Queued"),
])
def test_the_gang_runs_only_while_its_workload_is_admitted(the_job, wl, expected):
    held = kueue.hold(the_job, JobStatus(), wl)
    assert (held.reason if held else None) == expected


def test_the_queued_message_says_which_queue_and_why():
    held = kueue.hold(job(), JobStatus(), PENDING)
    assert "LocalQueue team-a" in held.message and "insufficient quota" in held.message


def test_a_finished_job_marks_its_workload_finished():
    done = JobStatus(phase="Succeeded", reason="AllNodesSucceeded")
    patch = kueue.workload_status_update(job(), done, ADMITTED, 0, NOW)
    assert patch["metadata"]["resourceVersion"] == "42"
    finished = [c for c in patch["status"]["conditions"] if c["type"] == "Finished"]
    assert finished and finished[0]["status"] == "True" and finished[0]["reason"] == "Succeeded"
    # ... once
    again = kueue.view_workload(workload(cond("Finished", True)))
    assert kueue.workload_status_update(job(), done, again, 0, NOW) is None


def test_an_evicted_job_gives_its_quota_back_only_when_its_pods_are_gone():
    assert kueue.workload_status_update(job(), JobStatus(phase="Queued"), EVICTED, 2, NOW) is None
    patch = kueue.workload_status_update(job(), JobStatus(phase="Queued"), EVICTED, 0, NOW)
    assert patch["status"]["admission"] is None
    by_type = {c["type"]: c for c in patch["status"]["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False"
    assert by_type["Requeued"]["status"] == "True" and by_type["Requeued"]["reason"] == "Preempted"
    assert by_type["Evicted"]["status"] == "True"  # Kueue resets it when it admits again


def test_a_job_without_a_queue_never_touches_workloads():
    assert kueue.workload_status_update(job(labels=None), JobStatus(phase="Succeeded"), ADMITTED, 0, NOW) is None


# --- reconcile passes ----------------------------------------------------------------------------
class KueueKube(FakeKube):
    def create_workload(self, wl):
        self.log.append(("create_workload", wl["metadata"]["name"], wl["spec"]["podSets"][0]["count"]))

    def patch_workload_status(self, namespace, name, patch):
        self.log.append(("patch_workload_status", name))
        self.workload_patch = patch

    def get_workload_priority(self, name):
        self.log.append(("get_priority", name))
        return 7


def body(**labels) -> dict:
    return {"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob",
            "metadata": {"name": "train", "namespace": "ns", "uid": UID, "generation": 1,
                         "labels": {**QUEUE, **labels}},
            "spec": {"nnodes": 2, "image": "img"}}


def run(kube, memory, wl=None, pods=()):
    return reconcile(body(), list(pods), memory, kube=kube, settings=SETTINGS,
                     post_event=lambda e: None, now=NOW, workload=wl)


def test_a_queued_job_creates_its_workload_once_and_no_pod():
    kube, memory = KueueKube(), JobMemory()
    run(kube, memory)
    run(kube, memory)
    assert [e for e in kube.log if e[0] == "create_workload"] == [("create_workload", "ddpjob-train", 2)]
    assert not [e for e in kube.log if e[0] == "create_pods"]
    assert kube.status["phase"] == "Queued"


def test_admission_creates_the_gang_and_eviction_deletes_it_then_requeues():
    kube, memory = KueueKube(), JobMemory()
    run(kube, memory, PENDING)
    run(kube, memory, ADMITTED)
    assert ("create_pods", ("train-node-0", "train-node-1")) in kube.log
    pods = [pod_view(0, phase="Running"), pod_view(1, phase="Running")]
    run(kube, memory, ADMITTED, pods)
    assert kube.status["phase"] == "Running"
    run(kube, memory, EVICTED, pods)
    assert kube.status["phase"] == "Queued" and kube.status["reason"] == "Preempted"
    assert ("delete", ("train-node-0", "train-node-1")) in kube.log
    assert not [e for e in kube.log if e[0] == "patch_workload_status"]  # pods still there
    run(kube, memory, EVICTED, [])
    assert ("patch_workload_status", "ddpjob-train") in kube.log
    assert kube.status["restarts"] == 0  # an eviction is not a failure


def test_the_priority_class_value_is_read_for_the_workload():
    kube, memory = KueueKube(), JobMemory()
    reconcile({**body(**{kueue.PRIORITY_LABEL: "high"})}, [], memory, kube=kube, settings=SETTINGS,
              post_event=lambda e: None, now=NOW)
    assert ("get_priority", "high") in kube.log


def test_the_admitted_flavors_node_labels_and_tolerations_go_on_the_pods():
    admitted = workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True)
    admitted["status"]["admission"]["podSetAssignments"][0]["flavors"] = {"cpu": "pool-a", "memory": "pool-a"}
    assert kueue.view_workload(admitted).flavors == ("pool-a",)
    toleration = {"key": "pool", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
    flavor = {"spec": {"nodeLabels": {"pool": "a"}, "tolerations": [toleration]}}
    the_job = job(template=spec.PodTemplate(spec=spec.PodTemplateSpec(nodeSelector={"zone": "z1"})))
    placed = kueue.with_flavors(the_job, [flavor])
    assert placed.spec.template.spec.nodeSelector == {"pool": "a", "zone": "z1"}
    assert list(placed.spec.template.spec.tolerations) == [toleration]
    assert kueue.with_flavors(the_job, [{"spec": {}}]) is the_job  # a quota-only flavor changes nothing


def test_an_admitted_gang_is_built_with_its_flavor():
    admitted = workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True)
    admitted["status"]["admission"]["podSetAssignments"][0]["flavors"] = {"cpu": "pool-a"}

    class FlavorKube(KueueKube):
        def get_resource_flavor(self, name):
            self.log.append(("get_flavor", name))
            return {"spec": {"nodeLabels": {"pool": "a"}}}

        def create_pods(self, pods):
            self.selectors = [p["spec"].get("nodeSelector") for p in pods]
            return super().create_pods(pods)

    kube, memory = FlavorKube(), JobMemory()
    run(kube, memory, kueue.view_workload(admitted))
    assert ("get_flavor", "pool-a") in kube.log
    assert kube.selectors == [{"pool": "a"}, {"pool": "a"}]


def test_a_deleted_workload_stops_the_gang_and_is_created_again():
    kube, memory = KueueKube(), JobMemory()
    run(kube, memory)                      # creates it
    run(kube, memory, ADMITTED)            # seen, admitted: the gang
    pods = [pod_view(0), pod_view(1)]
    run(kube, memory, None, pods)          # gone (someone deleted it)
    assert kube.status["phase"] == "Queued"
    assert ("delete", ("train-node-0", "train-node-1")) in kube.log
    assert [e for e in kube.log if e[0] == "create_workload"] == [("create_workload", "ddpjob-train", 2)] * 2
