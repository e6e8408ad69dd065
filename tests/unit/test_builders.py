"""The Service and Pods the operator creates (and `ddpjob render` prints)."""
from __future__ import annotations

import pytest

from tests.support import jobs
from ddpjob.controller import builders
from ddpjob.api import names
from ddpjob import contract
from ddpjob.api import spec

pytestmark = pytest.mark.unit


def make_job(nnodes: int = 2, uid: str | None = "uid-1", template: spec.PodTemplate | None = None, **kw) -> spec.DDPJob:
    return jobs.make_job(nnodes, namespace="team-a", uid=uid, image="registry/trainer:1",
                         template=template or spec.PodTemplate(), **kw)


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_pod_names_hostnames_and_subdomain_give_stable_dns():
    pods = builders.build_pods(make_job(3), attempt=0)
    assert [p["metadata"]["name"] for p in pods] == ["train-node-0", "train-node-1", "train-node-2"]
    for p in pods:
        assert p["spec"]["hostname"] == p["metadata"]["name"] and p["spec"]["subdomain"] == "train"
        assert p["metadata"]["namespace"] == "team-a" and p["spec"]["restartPolicy"] == "Never"


def test_env_is_the_contract_for_that_node():
    pod = builders.build_pod(make_job(3, nprocPerNode=2), node_rank=2, attempt=4)
    env = env_of(pod)
    expected = contract.node_environment(
        job_name="train", namespace="team-a", master_addr="train-node-0.train.team-a.svc", master_port=29500,
        nnodes=3, nproc_per_node=2, node_rank=2, restart_attempt=4, device="cpu", rendezvous_timeout_seconds=600,
        job_uid="uid-1")
    assert {k: env[k] for k in expected} == expected
    assert env["DDPJOB_UID"] == "uid-1"  # whose its checkpoints are: the DDPJob's metadata.uid
    assert list(env)[: len(expected)] == list(expected)  # the contract first, in its order
    assert env["WORLD_SIZE"] == "6" and env["RANK"] == "4" and env["PET_NODE_RANK"] == "2"


def test_user_env_follows_the_contract():
    job = make_job(env=({"name": "HF_HOME", "value": "/cache"}, {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}))
    env = builders.build_pod(job, 0, 0)["spec"]["containers"][0]["env"]
    assert env[-2:] == [{"name": "HF_HOME", "value": "/cache"}, {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]


def test_owner_reference_makes_children_garbage_collected():
    pod = builders.build_pod(make_job(), 0, 0)
    assert pod["metadata"]["ownerReferences"] == [{
        "apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob", "name": "train", "uid": "uid-1",
        "controller": True, "blockOwnerDeletion": True}]
    assert "ownerReferences" not in builders.build_pod(make_job(uid=None), 0, 0)["metadata"]


def test_labels_and_annotations():
    template = spec.PodTemplate(metadata=spec.PodMetadata(labels={"team": "ml", names.LABEL_NODE_RANK: "bogus"},
                                                          annotations={"a": "b"}))
    meta = builders.build_pod(make_job(template=template), 1, 3)["metadata"]
    assert meta["labels"] == {"team": "ml", names.LABEL_JOB_NAME: "train", names.LABEL_NODE_RANK: "1",
                              names.LABEL_RESTART_ATTEMPT: "3"}  # ours win
    assert meta["annotations"] == {"a": "b"}


def test_container_defaults():
    c = builders.build_pod(make_job(args=("--epochs", "2")), 0, 0)["spec"]["containers"][0]
    assert c["name"] == "trainer" and c["image"] == "registry/trainer:1" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == list(contract.DEFAULT_POD_COMMAND) and c["args"] == ["--epochs", "2"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["ports"] == [{"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"},
                          {"name": "progress", "containerPort": 29400, "protocol": "TCP"}]
    custom = builders.build_pod(make_job(command=("torchrun", "train.py")), 0, 0)["spec"]["containers"][0]
    assert custom["command"] == ["torchrun", "train.py"]


def test_shm_is_memory_backed_with_the_requested_size():
    pod = builders.build_pod(make_job(shmSize="8Gi"), 0, 0)
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["spec"]["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]


def test_gpu_jobs_ask_for_one_gpu_per_process():
    res = builders.build_pod(make_job(device="gpu", nprocPerNode=8, resources={"limits": {"memory": "64Gi"}}), 0, 0)
    limits = res["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "64Gi", "nvidia.com/gpu": 8}
    assert "nvidia.com/gpu" not in builders.build_pod(make_job(), 0, 0)["spec"]["containers"][0]["resources"].get("limits", {})
    assert env_of(res)["DDPJOB_DEVICE"] == "gpu"


def test_restricted_pod_security_by_default():
    pod = builders.build_pod(make_job(), 0, 0)
    assert pod["spec"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["spec"]["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


def test_a_template_security_context_replaces_the_default():
    template = spec.PodTemplate(spec=spec.PodTemplateSpec(securityContext={"runAsUser": 0}))
    pod = builders.build_pod(make_job(template=template), 0, 0)
    assert pod["spec"]["securityContext"] == {"runAsUser": 0}
    # no container-level runAsNonRoot to contradict the template; never privilege escalation
    assert pod["spec"]["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_template_spec_is_copied():
    tmpl = spec.PodTemplateSpec(
        nodeSelector={"pool": "gpu"}, tolerations=({"key": "gpu", "operator": "Exists"},),
        affinity={"nodeAffinity": {}}, volumes=({"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}},),
        serviceAccountName="sa", priorityClassName="high", schedulerName="volcano", runtimeClassName="nvidia",
        imagePullSecrets=({"name": "regcred"},), terminationGracePeriodSeconds=120)
    job = make_job(template=spec.PodTemplate(spec=tmpl), volumeMounts=({"name": "ckpt", "mountPath": "/ckpt"},))
    s = builders.build_pod(job, 0, 0)["spec"]
    assert s["nodeSelector"] == {"pool": "gpu"} and s["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert s["affinity"] == {"nodeAffinity": {}} and s["serviceAccountName"] == "sa"
    assert (s["priorityClassName"], s["schedulerName"], s["runtimeClassName"]) == ("high", "volcano", "nvidia")
    assert s["imagePullSecrets"] == [{"name": "regcred"}] and s["terminationGracePeriodSeconds"] == 120
    assert {"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}} in s["volumes"]
    assert {"name": "ckpt", "mountPath": "/ckpt"} in s["containers"][0]["volumeMounts"]
    assert "activeDeadlineSeconds" not in s  # the operator enforces the job's deadline itself


def test_unset_template_fields_are_left_out():
    s = builders.build_pod(make_job(), 0, 0)["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "serviceAccountName", "priorityClassName",
                "schedulerName", "runtimeClassName", "imagePullSecrets"):
        assert key not in s
    assert s["enableServiceLinks"] is False


def test_builders_do_not_share_state_with_the_spec():
    job = make_job(env=({"name": "A", "value": "1"},))
    pod = builders.build_pod(job, 0, 0)
    pod["spec"]["containers"][0]["env"][-1]["value"] = "changed"
    assert job.spec.env[0]["value"] == "1"


def test_headless_service_publishes_not_ready_addresses():
    svc = builders.build_service(make_job(masterPort=23456))
    assert svc["metadata"]["name"] == "train" and svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert svc["spec"] == {"clusterIP": "None", "publishNotReadyAddresses": True,
                           "selector": {names.LABEL_JOB_NAME: "train"},
                           "ports": [{"name": "rendezvous", "port": 23456, "targetPort": 23456, "protocol": "TCP"}]}
    pod_env = env_of(builders.build_pod(make_job(masterPort=23456), 1, 0))
    assert pod_env["MASTER_ADDR"] == "train-node-0.train.team-a.svc" and pod_env["MASTER_PORT"] == "23456"


def test_only_some_ranks():
    assert [p["metadata"]["name"] for p in builders.build_pods(make_job(4), 1, ranks=[3, 1])] == ["train-node-1", "train-node-3"]
