"""The children of a DDPJob, as plain dicts: its headless Service and one Pod per node.

Pure functions of a parsed ``spec.DDPJob``. The operator creates exactly what these return and
``ddpjob render`` prints exactly what these return, so the two cannot drift.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping, Optional

from ddpjob import contract
from ddpjob.api import names
from ddpjob.api import spec
from ddpjob.restart_orders import RestartKey

CONTAINER_NAME = names.CONTAINER_NAME
SHM_VOLUME = names.SHM_VOLUME_NAME  # the schema refuses a template volume of this name
RENDEZVOUS_PORT_NAME = names.RENDEZVOUS_PORT_NAME
PROGRESS_PORT_NAME = "progress"

# The "restricted" Pod Security profile, split as the API wants it. The pod-level part is
# replaced as a whole when the template supplies its own securityContext (the user then owns
# runAsNonRoot and seccompProfile); the container-level part stays, since the spec offers no
# container securityContext to ask for privileges with, and dropping it would turn a template
# that only sets runAsUser/fsGroup into one the "restricted" profile refuses.
DEFAULT_POD_SECURITY_CONTEXT = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}

Credential = tuple[str, str]  # a pod's (nonce, digest of its restart token): restart_orders.RestartKey


def owner_reference(job: spec.DDPJob) -> dict[str, Any]:
    """Children are garbage-collected with the DDPJob: no finalizer needed, none that can block
    deletion while the operator is down."""
    return {
        "apiVersion": f"{names.API_GROUP}/{names.API_VERSION}",
        "kind": names.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owner_uid(metadata: Mapping[str, Any]) -> Optional[str]:
    """The uid of the DDPJob an object's controller owner reference names (``owner_reference``
    read back), or None: what tells a child of ours (a pod, a Kueue Workload) from an object
    that only carries the job's label."""
    return next((o.get("uid") for o in metadata.get("ownerReferences") or ()
                 if o.get("kind") == names.KIND and o.get("controller")), None)


def _metadata(job: spec.DDPJob, name: str, labels: dict[str, str],
              annotations: Optional[dict[str, str]] = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    # A manifest rendered from a file has no uid yet; an owner reference needs one.
    if job.uid:
        meta["ownerReferences"] = [owner_reference(job)]
    return meta


def build_service(job: spec.DDPJob) -> dict[str, Any]:
    """Headless, publishing not-ready addresses: ``<pod>.<service>.<ns>.svc`` resolves as soon as
    a pod has an IP, before any readiness (JobSet's default; the fix for workers failing with
    "host not found" before the master has a record, kubeflow/pytorch-operator#125, #333)."""
    name = names.service_name(job.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, name, {names.LABEL_JOB_NAME: job.name}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_JOB_NAME: job.name},
            "ports": [{
                "name": RENDEZVOUS_PORT_NAME,
                "port": job.spec.masterPort,
                "targetPort": job.spec.masterPort,
                "protocol": "TCP",
            }],
        },
    }


def pod_labels(job: spec.DDPJob, node_rank: int, attempt: int) -> dict[str, str]:
    """Template labels, then ours (ours win: the operator finds its pods by them)."""
    labels = dict(job.spec.template.metadata.labels)
    labels.update({
        names.LABEL_JOB_NAME: job.name,
        names.LABEL_NODE_RANK: str(node_rank),
        names.LABEL_RESTART_ATTEMPT: str(attempt),
    })
    return labels


def pod_environment(job: spec.DDPJob, node_rank: int, attempt: int,
                    restart_credential: Optional[Credential] = None) -> list[dict[str, Any]]:
    """The contract's variables first, then the user's (which may not redefine them: the schema
    refuses reserved names, so order only matters for ``$(VAR)`` references to ours)."""
    s = job.spec
    service = names.service_name(job.name)
    in_place = restart_credential if spec.effective_restart_mode(s) == contract.RESTART_MODE_IN_PLACE else None
    env = contract.node_environment(
        job_name=job.name,
        namespace=job.namespace,
        # Whose the job's checkpoints are: a namesake created later has another uid. Empty in a
        # manifest rendered from a file (no uid yet).
        job_uid=job.uid or "",
        master_addr=names.master_address(job.name, service, job.namespace),
        master_port=s.masterPort,
        nnodes=s.nnodes,
        nproc_per_node=s.nprocPerNode,
        node_rank=node_rank,
        restart_attempt=attempt,
        device=s.device,
        # The pod entry point waits this long for the master; pods that are not all up by then
        # fail the job with StartupTimeout anyway.
        rendezvous_timeout_seconds=s.startupTimeoutSeconds,
        # What the pod entry point starts (docs/launch-styles.md); the command stays as given.
        launcher=spec.effective_launcher(s),
        local_rank_flag=s.localRankFlag,
        # In place: the entry point waits this long for the operator's restart order after
        # its workers failed, then exits with their code (and the pod is recreated).
        restart_mode=spec.effective_restart_mode(s),
        # Never the token itself: its digest and the nonce the operator's key makes it from.
        restart_token_sha256=in_place[1] if in_place else None,
        restart_nonce=in_place[0] if in_place else None,
        restart_wait_seconds=contract.DEFAULT_RESTART_WAIT_SECONDS,
        permanent_exit_codes=s.failurePolicy.permanentExitCodes,
    )
    return [{"name": k, "value": v} for k, v in env.items()] + [copy.deepcopy(dict(e)) for e in s.env]


def container_resources(job: spec.DDPJob) -> dict[str, Any]:
    """The user's resources; a GPU job gets ``nvidia.com/gpu`` = processes per node."""
    resources = copy.deepcopy({k: dict(v) for k, v in job.spec.resources.items()})
    if job.spec.device == "gpu":
        limits = resources.setdefault("limits", {})
        limits.setdefault(spec.GPU_RESOURCE, job.spec.nprocPerNode)
    return resources


def readiness_probe() -> dict[str, Any]:
    """The entry point answers 503 on /ready once its attempt failed: the pod's Ready condition
    drops within a second, which is the pod watch event that starts an in-place restart."""
    return {"httpGet": {"path": contract.READY_PATH, "port": PROGRESS_PORT_NAME},
            "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 1}


def kubelet_restart_rules(s: spec.DDPJobSpec) -> dict[str, Any]:
    """A command of your own under InPlace: the kubelet restarts the container in its pod on
    any exit but success and the permanent codes (KEP-5307, beta and on since Kubernetes 1.35).
    ``Restart`` and not ``RestartAllContainers``: a node whose kubelet lacks the rules ignores
    them (the pod fails, and is recreated, as without), where a RestartAllContainers pod would
    wait Pending for a node that declares the feature. An API server without the gate drops
    the fields; the operator reads the pod back (observation.view_pod) and knows."""
    codes = sorted({0, *s.failurePolicy.permanentExitCodes})
    return {"restartPolicy": "Never",
            "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": codes}}]}


def build_pod(job: spec.DDPJob, node_rank: int, attempt: int,
              restart_credential: Optional[Credential] = None, kubelet_rules: bool = True) -> dict[str, Any]:
    """One node's pod. ``restart_credential``: (nonce, token digest) of in-place restart orders (per
    pod, ddpjob/restart_orders.py); without one (``ddpjob render``) the pod is restarted
    by recreating it."""
    name = names.node_pod_name(job.name, node_rank)
    annotations = dict(job.spec.template.metadata.annotations)
    container = _trainer_container(job, node_rank, attempt, restart_credential, kubelet_rules, annotations)
    # activeDeadlineSeconds is deliberately not set on pods: the operator enforces it for the
    # whole job (a per-pod deadline would count from each restart and fail pods one by one).
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, name, pod_labels(job, node_rank, attempt), annotations),
        "spec": _pod_spec(job, name, container),
    }


def _trainer_container(job: spec.DDPJob, node_rank: int, attempt: int, restart_credential: Optional[Credential],
                       kubelet_rules: bool, annotations: dict[str, str]) -> dict[str, Any]:
    """The pod's one container; ``annotations`` (the pod's) gains what the kubelet reads."""
    s = job.spec
    tmpl = s.template.spec
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": s.image,
        "imagePullPolicy": s.imagePullPolicy,
        "command": list(s.command) if s.command else list(contract.DEFAULT_POD_COMMAND),
        "args": list(s.args),
        "env": pod_environment(job, node_rank, attempt, restart_credential),
        "ports": [{"name": RENDEZVOUS_PORT_NAME, "containerPort": s.masterPort, "protocol": "TCP"},
                  # The pod entry point serves the ranks' progress here; the operator polls it.
                  {"name": PROGRESS_PORT_NAME, "containerPort": contract.DEFAULT_PROGRESS_PORT,
                   "protocol": "TCP"}],
        "resources": container_resources(job),
        # DataLoader workers need more than the 64 MiB default /dev/shm (peers' pain point 10).
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
        + [copy.deepcopy(dict(m)) for m in s.volumeMounts],
        # The trainer writes a one-line summary to /dev/termination-log; a crash before that
        # still leaves the log tail, which the operator copies into status.failedNode.message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if restart_credential and spec.effective_restart_mode(s) == contract.RESTART_MODE_IN_PLACE:
        container["readinessProbe"] = readiness_probe()
    if kubelet_rules and spec.kubelet_restarts_in_place(s):
        container.update(kubelet_restart_rules(s))
        # A container the kubelet restarts keeps its pod's environment: the attempt comes from
        # an annotation the kubelet reads at each start, and the operator moves on.
        container["env"] = [{"name": contract.DDPJOB_RESTART_ATTEMPT, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{names.ANNOTATION_ATTEMPT_AT_START}']"}}}
            if e.get("name") == contract.DDPJOB_RESTART_ATTEMPT else e for e in container["env"]]
        annotations[names.ANNOTATION_ATTEMPT_AT_START] = str(attempt)
    container["securityContext"] = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)
    if tmpl.securityContext is None:
        container["securityContext"]["runAsNonRoot"] = True
    return container


def _pod_spec(job: spec.DDPJob, name: str, container: dict[str, Any]) -> dict[str, Any]:
    s = job.spec
    tmpl = s.template.spec
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": names.service_name(job.name),
        # The operator restarts the whole gang; an in-place restart never rejoins its peers
        # (kubeflow/pytorch-operator#364, kubeflow/trainer#2000).
        "restartPolicy": "Never",
        # Service links add <SVC>_SERVICE_HOST, <SVC>_PORT=tcp://... for every Service in the
        # namespace: hundreds of variables in a busy one, and look-alikes of ours (a Service
        # named "master" yields MASTER_SERVICE_HOST). Nothing here needs them.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": tmpl.terminationGracePeriodSeconds,
        "securityContext": copy.deepcopy(dict(tmpl.securityContext))
        if tmpl.securityContext is not None else copy.deepcopy(DEFAULT_POD_SECURITY_CONTEXT),
        "containers": [container],
        "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": s.shmSize}}]
        + [copy.deepcopy(dict(v)) for v in tmpl.volumes],
    }
    optional = {
        "nodeSelector": dict(tmpl.nodeSelector) or None,
        "tolerations": [copy.deepcopy(dict(t)) for t in tmpl.tolerations] or None,
        "affinity": copy.deepcopy(dict(tmpl.affinity)) if tmpl.affinity else None,
        "serviceAccountName": tmpl.serviceAccountName,
        "priorityClassName": tmpl.priorityClassName,
        "schedulerName": tmpl.schedulerName,
        "runtimeClassName": tmpl.runtimeClassName,
        "imagePullSecrets": [copy.deepcopy(dict(i)) for i in tmpl.imagePullSecrets] or None,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    return pod_spec


def build_pods(job: spec.DDPJob, attempt: int, ranks: Optional[list[int]] = None,
               restart_key: Optional[RestartKey] = None, kubelet_rules: bool = True) -> list[dict[str, Any]]:
    """The pods of one attempt (every node, or only ``ranks``), in rank order; ``restart_key``
    gives each its restart credential."""
    ranks = list(range(job.spec.nnodes)) if ranks is None else sorted(ranks)
    return [build_pod(job, r, attempt,
                      restart_key.credential(job.namespace, names.node_pod_name(job.name, r)) if restart_key else None,
                      kubelet_rules) for r in ranks]
