"""Kueue admission (docs/kueue.md): the Workload a queued DDPJob gets, when its gang may run,
and what the operator writes back to Kueue. Pure functions, and reconcile passes on a fake API."""
from __future__ import annotations

from dataclasses import replace

import pytest

from ddpjob.api import names, spec
from ddpjob.api.status import JobStatus
from ddpjob.controller import kueue
from ddpjob.controller.reconcile import JobMemory, reconcile
from tests.support.jobs import UID, pod_view
from tests.support.operator_fakes import NOW, SETTINGS, FakeKube, running_status

pytestmark = pytest.mark.unit

QUEUE = {kueue.QUEUE_LABEL: "team-a"}


def job(nnodes: int = 2, labels=QUEUE, **fields) -> spec.DDPJob:
    return spec.DDPJob(name="train", namespace="ns", uid=UID, labels=dict(labels or {}),
                       spec=spec.DDPJobSpec(nnodes=nnodes, image="img",
                                            resources={"requests": {"cpu": "1"}}, **fields))


def cond(type_: str, status: bool, reason: str = "R", message: str = "") -> dict:
    return {"type": type_, "status": "True" if status else "False", "reason": reason,
            "message": message, "lastTransitionTime": "2025-01-01T11:00:00Z"}


def workload(*conditions: dict, admission: bool = False, owner: str | None = UID, count: int = 2,
             queue: str = "team-a", name: str = "ddpjob-train", uid: str = "wl-uid",
             spec_hash: str = "") -> dict:
    meta = {"name": name, "namespace": "ns", "uid": uid, "generation": 1,
            "resourceVersion": "42", "labels": {names.LABEL_JOB_NAME: "train"}}
    if owner:
        meta["ownerReferences"] = [{"kind": names.KIND, "uid": owner, "controller": True}]
    if spec_hash:
        meta["annotations"] = {kueue.POD_SPEC_HASH_ANNOTATION: spec_hash}
    status = {"conditions": list(conditions)}
    if admission:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [{"name": "node", "count": count}]}
    return {"metadata": meta, "spec": {"queueName": queue, "podSets": [{"name": "node", "count": count}]},
            "status": status}


def hold(the_job, wl, status=JobStatus(), **settings):
    return kueue.hold(the_job, status, kueue.standing(the_job, status, [wl] if wl else [], **settings))


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
    assert wl["metadata"]["annotations"] == {kueue.POD_SPEC_HASH_ANNOTATION: spec.pod_spec_hash(job(nnodes=3).spec)}
    assert "priorityClassRef" not in wl["spec"]
    assert kueue.view_workload(wl).pod_count == 3 and kueue.view_workload(wl).queue_name == "team-a"


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
    held = hold(the_job, wl)
    assert (held.reason if held else None) == expected


def test_the_queued_message_says_which_queue_and_why():
    held = hold(job(), PENDING)
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


def test_a_job_without_a_queue_and_without_a_workload_never_touches_workloads():
    bare = job(labels=None)
    place = kueue.standing(bare, JobStatus(), [])
    assert place.queue is None
    assert kueue.plan_workload(bare, JobStatus(), place, kueue.WorkloadBook(), 0, NOW) is None


# --- reconcile passes ----------------------------------------------------------------------------
class KueueKube(FakeKube):
    def create_workload(self, wl):
        self.log.append(("create_workload", wl["metadata"]["name"], wl["spec"]["podSets"][0]["count"]))
        self.created_workload = wl

    def delete_workload(self, namespace, name, uid):
        self.log.append(("delete_workload", name, uid))

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


def run(kube, memory, wl=None, pods=(), the_body=None, settings=SETTINGS):
    workloads = list(wl) if isinstance(wl, (list, tuple)) else [wl] if wl else []
    return reconcile(the_body or body(), list(pods), memory, kube=kube, settings=settings,
                     post_event=lambda e: None, now=NOW, workloads=workloads)


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


# --- item 7: the pods created always match what Kueue admitted ------------------------------------
def test_a_workload_of_another_shape_is_stale_and_holds_the_job():
    """nnodes edited while Queued: the Workload asks for 1 pod, the job for 2."""
    one = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True, count=1))
    place = kueue.standing(job(nnodes=2), JobStatus(), [one])
    assert "admitted for 1 pod(s), the job now has 2" in place.stale
    held = hold(job(nnodes=2), one)
    assert held is not None and held.reason == "Queued" and "queueing again" in held.message
    assert kueue.pod_flavors(place, creating=True) == ()


def test_any_pod_shaping_edit_makes_the_workload_stale():
    built = kueue.view_workload(kueue.build_workload(job()))
    assert kueue.standing(job(), JobStatus(), [built]).stale is None
    reshaped = job(args=("--lr", "0.1"))
    assert "pod template changed" in kueue.standing(reshaped, JobStatus(), [built]).stale


def test_a_running_attempt_is_judged_by_the_shape_it_was_created_with():
    """A spec changed under a running gang (a bypass) applies to the next attempt: the gang
    Kueue admitted keeps running; the next attempt re-queues."""
    admitted = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True, count=2))
    running = replace(running_status(), podSpecHash="abc")
    assert kueue.standing(job(nnodes=4), running, [admitted]).stale is None
    assert kueue.standing(job(nnodes=4), JobStatus(phase="Queued"), [admitted]).stale is not None


def test_an_edited_queued_job_deletes_its_workload_and_queues_again_in_its_new_shape():
    kube, memory = KueueKube(), JobMemory()
    one = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True, count=1))
    run(kube, memory, one)                              # body(): nnodes 2, admitted for 1
    assert not [e for e in kube.log if e[0] == "create_pods"]
    assert ("delete_workload", "ddpjob-train", "wl-uid") in kube.log
    assert kube.status["phase"] == "Queued" and "admitted for 1 pod(s)" in kube.status["message"]
    run(kube, memory, None)                             # gone: a new one, for 2
    assert ("create_workload", "ddpjob-train", 2) in kube.log
    two = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True, count=2,
                                       uid="wl-uid-2"))
    run(kube, memory, two)
    assert ("create_pods", ("train-node-0", "train-node-1")) in kube.log


def test_a_stale_workload_is_kept_while_pods_of_what_it_admitted_still_exist():
    kube, memory = KueueKube(), JobMemory()
    one = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True, count=1))
    run(kube, memory, one, pods=[pod_view(0, phase="Running")])
    assert ("delete", ("train-node-0",)) in kube.log
    assert not [e for e in kube.log if e[0] == "delete_workload"]


# --- item 8: what was admitted is released, whatever the labels say ------------------------------
def unlabelled_body() -> dict:
    obj = body()
    obj["metadata"]["labels"] = {}
    return obj


def test_a_finished_job_whose_label_was_removed_still_finishes_its_workload():
    done = JobStatus(phase="Succeeded", reason="AllNodesSucceeded")
    bare = job(labels=None)
    step = kueue.plan_workload(bare, done, kueue.standing(bare, done, [ADMITTED]), kueue.WorkloadBook(), 0, NOW)
    assert step is not None and step.delete is None
    assert {c["type"]: c["status"] for c in step.status_patch["status"]["conditions"]}["Finished"] == "True"


def test_a_job_whose_label_was_removed_gives_its_workload_up_once_its_gang_stops():
    kube, memory = KueueKube(), JobMemory()
    running = unlabelled_body()
    running["status"] = running_status().to_dict()
    pods = [pod_view(0, phase="Running"), pod_view(1, phase="Running")]
    run(kube, memory, ADMITTED, pods, the_body=running)
    assert not [e for e in kube.log if e[0] in ("delete_workload", "delete")]  # the admitted gang runs on
    suspended = unlabelled_body()
    suspended["spec"]["suspend"] = True
    suspended["metadata"]["generation"] = 2
    run(kube, memory, ADMITTED, pods, the_body=suspended)
    assert ("delete", ("train-node-0", "train-node-1")) in kube.log
    assert "delete_workload" not in kube.kinds()  # not while its pods exist
    run(kube, memory, ADMITTED, [], the_body=suspended)
    assert ("delete_workload", "ddpjob-train", "wl-uid") in kube.log


def test_a_suspended_admitted_job_gives_its_quota_back_and_queues_again_when_resumed():
    """spec.suspend on an admitted job: the gang is stopped, then its Workload deleted (Kueue
    releases the quota at once); no Workload while suspended; resumed, it queues anew."""
    kube, memory = KueueKube(), JobMemory()
    running = body()
    running["status"] = running_status().to_dict()
    pods = [pod_view(0, phase="Running"), pod_view(1, phase="Running")]
    run(kube, memory, ADMITTED, pods, the_body=running)
    suspended = body()
    suspended["status"] = running_status().to_dict()
    suspended["spec"]["suspend"] = True
    suspended["metadata"]["generation"] = 2
    run(kube, memory, ADMITTED, pods, the_body=suspended)
    assert ("delete", ("train-node-0", "train-node-1")) in kube.log
    assert "delete_workload" not in kube.kinds()  # the quota covers pods still stopping
    run(kube, memory, ADMITTED, [], the_body=suspended)
    assert ("delete_workload", "ddpjob-train", "wl-uid") in kube.log
    assert kube.status["phase"] == "Suspended"
    run(kube, memory, None, [], the_body=suspended)
    assert "create_workload" not in kube.kinds()  # a suspended job holds no Workload
    resumed = body()
    resumed["metadata"]["generation"] = 3
    run(kube, memory, None, [], the_body=resumed)
    assert "create_workload" in kube.kinds()
    assert kube.status["phase"] == "Queued"  # waits for the new Workload's admission


def test_a_label_edit_is_seen_by_the_next_pass_without_a_spec_edit():
    """Labels do not move the generation: the parsed job must not be cached across them."""
    kube, memory = KueueKube(), JobMemory()
    run(kube, memory, PENDING)
    assert kube.status["phase"] == "Queued"
    run(kube, memory, PENDING, the_body=unlabelled_body())   # same generation, label gone
    assert ("create_pods", ("train-node-0", "train-node-1")) in kube.log


def test_a_label_edit_wakes_the_jobs_worker():
    import asyncio

    from ddpjob.controller import workqueue
    from ddpjob.controller.settings import OperatorSettings
    from tests.support.operator_fakes import eventually

    async def scenario():
        runtime, kube = workqueue.Runtime(), KueueKube()
        runtime.start(OperatorSettings(coalesce_seconds=0.001), lambda settings: kube)
        try:
            runtime.observe(None, body(), {})
            await eventually(lambda: "create_workload" in kube.kinds())
            runtime.observe("MODIFIED", unlabelled_body(), {})  # no other event, no clock due
            await eventually(lambda: "create_pods" in kube.kinds())
        finally:
            await runtime.stop()

    asyncio.run(scenario())


# --- item 9: every DDPJob can be made to queue ------------------------------------------------------
MANAGE_ALL = replace(SETTINGS, manage_jobs_without_queue_name=True)


def test_the_setting_queues_an_unlabelled_job_in_the_default_local_queue():
    kube, memory = KueueKube(), JobMemory()
    run(kube, memory, None, the_body=unlabelled_body(), settings=MANAGE_ALL)
    assert ("create_workload", "ddpjob-train", 2) in kube.log
    assert kube.created_workload["spec"]["queueName"] == kueue.DEFAULT_LOCAL_QUEUE
    assert not [e for e in kube.log if e[0] == "create_pods"]
    assert kube.status["phase"] == "Queued" and "LocalQueue default" in kube.status["message"]
    # without the setting the same job runs at once
    kube, memory = KueueKube(), JobMemory()
    run(kube, memory, None, the_body=unlabelled_body())
    assert "create_workload" not in kube.kinds() and "create_pods" in kube.kinds()


def test_the_setting_never_stops_a_job_that_was_already_running():
    running = running_status()
    bare = job(labels=None)
    place = kueue.standing(bare, running, [], manage_without_queue_name=True)
    assert place.queue is None and kueue.hold(bare, running, place) is None
    assert kueue.standing(bare, JobStatus(), [], manage_without_queue_name=True).queue == "default"
    assert kueue.standing(job(), JobStatus(), [], manage_without_queue_name=True).queue == "team-a"


def test_the_setting_is_read_from_the_environment():
    from ddpjob.controller.settings import load_settings

    assert load_settings({"DDPJOB_OPERATOR_MANAGE_JOBS_WITHOUT_QUEUE_NAME": "true"}).manage_jobs_without_queue_name
    assert not load_settings({}).manage_jobs_without_queue_name
    with pytest.raises(ValueError, match="MANAGE_JOBS_WITHOUT_QUEUE_NAME"):
        load_settings({"DDPJOB_OPERATOR_MANAGE_JOBS_WITHOUT_QUEUE_NAME": "maybe"})


# --- item 10: only the Workload the job owns counts -----------------------------------------------
def test_only_the_workload_the_job_controls_decides_whether_it_runs():
    decoy = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True), admission=True,
                                         owner="someone-else", name="decoy", uid="decoy-uid"))
    unowned = kueue.view_workload(workload(cond("Admitted", True), admission=True, owner=None,
                                           name="loose", uid="loose-uid"))
    for order in ([decoy, unowned, PENDING], [PENDING, unowned, decoy]):
        place = kueue.standing(job(), JobStatus(), order)
        assert place.workload == PENDING
        assert kueue.hold(job(), JobStatus(), place).reason == "Queued"
    assert kueue.standing(job(), JobStatus(), [decoy, unowned]).workload is None


def test_foreign_workloads_are_never_deleted_or_patched_and_do_not_stop_the_jobs_own():
    kube, memory = KueueKube(), JobMemory()
    decoy = kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True),
                                         cond("Evicted", True, "Preempted"), admission=True, count=1,
                                         owner="someone-else", name="decoy", uid="decoy-uid"))
    run(kube, memory, [decoy])                      # only a decoy: the job's own is created
    assert ("create_workload", "ddpjob-train", 2) in kube.log
    assert kube.status["phase"] == "Queued"
    run(kube, memory, [decoy, ADMITTED])            # its own admitted: the gang
    assert ("create_pods", ("train-node-0", "train-node-1")) in kube.log
    done = body()
    done["status"] = {"phase": "Succeeded", "reason": "AllNodesSucceeded"}
    run(kube, JobMemory(), [decoy, ADMITTED], the_body=done)
    assert [e for e in kube.log if e[0] in ("delete_workload", "patch_workload_status")] == [
        ("patch_workload_status", "ddpjob-train")]


def test_a_namesake_workload_of_another_object_is_waited_out_not_taken():
    kube, memory = KueueKube(), JobMemory()
    namesake = kueue.view_workload(workload(cond("Admitted", True), admission=True, owner="old-uid", uid="old-wl"))
    run(kube, memory, [namesake])
    assert "create_workload" not in kube.kinds() and "create_pods" not in kube.kinds()
    assert "belongs to another object" in kube.status["message"]
    run(kube, memory, [])                           # gone by garbage collection
    assert ("create_workload", "ddpjob-train", 2) in kube.log


# --- PodsReady, which Kueue's waitForPodsReady reads ---------------------------------------------
def pods_ready_of(patch):
    if patch is None:
        return None
    found = [c for c in patch["status"]["conditions"] if c["type"] == kueue.PODS_READY]
    return (found[0]["status"], found[0]["reason"]) if found else None


def with_pods_ready(status: bool, reason: str):
    return kueue.view_workload(workload(cond("QuotaReserved", True), cond("Admitted", True),
                                        cond(kueue.PODS_READY, status, reason), admission=True))


def test_pods_ready_follows_the_gang_through_an_in_place_restart_as_kueues_own_reconciler_would():
    running = JobStatus(phase="Running")
    # admitted, the pods starting: no condition, which Kueue reads as WaitForStart (its startup
    # timeout counts); no write for it
    assert kueue.workload_status_update(job(), running, ADMITTED, 2, NOW) is None
    waiting = with_pods_ready(False, "WaitForStart")
    assert kueue.workload_status_update(job(), running, waiting, 2, NOW) is None  # nothing new: no write
    # every pod ready: Started
    assert pods_ready_of(kueue.workload_status_update(job(), running, waiting, 2, NOW, True)) == ("True", "Started")
    assert pods_ready_of(kueue.workload_status_update(job(), running, ADMITTED, 2, NOW, True)) == ("True", "Started")
    started = with_pods_ready(True, "Started")
    assert kueue.workload_status_update(job(), running, started, 2, NOW, True) is None
    # a rank failed, the pods stay (in place) but their readiness dropped: WaitForRecovery, so
    # that only waitForPodsReady.recoveryTimeout, not the startup timeout, applies
    assert pods_ready_of(kueue.workload_status_update(job(), running, started, 2, NOW, False)) == ("False", "WaitForRecovery")
    recovering = with_pods_ready(False, "WaitForRecovery")
    assert kueue.workload_status_update(job(), running, recovering, 2, NOW, False) is None
    # the next attempt's pods ready again: Recovered
    assert pods_ready_of(kueue.workload_status_update(job(), running, recovering, 2, NOW, True)) == ("True", "Recovered")


def test_a_queued_workload_gets_no_pods_ready_write_and_an_evicted_one_starts_over():
    assert kueue.workload_status_update(job(), JobStatus(phase="Queued"), PENDING, 0, NOW) is None
    evicted_then_readmission_pending = kueue.view_workload(workload(
        cond("QuotaReserved", False, "Pending"), cond(kueue.PODS_READY, True, "Started")))
    patch = kueue.workload_status_update(job(), JobStatus(phase="Queued"), evicted_then_readmission_pending, 0, NOW)
    assert pods_ready_of(patch) == ("False", "WaitForStart")
    # evicted: nothing while its gang stops; the quota given back resets it with the rest
    ready_then_evicted = kueue.view_workload(workload(
        cond("QuotaReserved", True), cond("Admitted", True), cond("Evicted", True, "Preempted"),
        cond(kueue.PODS_READY, True, "Started"), admission=True))
    assert kueue.workload_status_update(job(), JobStatus(phase="Running"), ready_then_evicted, 2, NOW, False) is None
    patch = kueue.workload_status_update(job(), JobStatus(phase="Queued"), ready_then_evicted, 0, NOW)
    assert pods_ready_of(patch) == ("False", "WaitForStart") and patch["status"]["admission"] is None


def test_gang_ready_counts_ready_or_succeeded_pods_of_the_attempt_only():
    two = job()
    ready = [pod_view(0, container_ready=True), pod_view(1, container_ready=True)]
    assert kueue.gang_ready(two, 0, ready)
    assert not kueue.gang_ready(two, 0, [ready[0], pod_view(1, container_ready=False)])
    assert kueue.gang_ready(two, 0, [ready[0], pod_view(1, phase="Succeeded")])
    assert not kueue.gang_ready(two, 1, ready)  # the attempt's pods, not the last one's
    assert not kueue.gang_ready(two, 0, [ready[0], pod_view(1, container_ready=True, owner_uid="someone-else")])
