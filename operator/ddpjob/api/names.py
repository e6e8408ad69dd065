"""The API's identity and the names of a job's children: group, version, kind, labels, pods.

Shared by the CRD, the operator, `ddpjob render` and `ddpjob run`. The trainer never needs
these: what it reads is the pod environment (``ddpjob.contract``).
"""
from __future__ import annotations

API_GROUP = "ddpjob.dev"
API_VERSION = "v1alpha1"
KIND = "DDPJob"
PLURAL = "ddpjobs"
SINGULAR = "ddpjob"
SHORT_NAMES = ("ddpj", "ddp")
CRD_NAME = f"{PLURAL}.{API_GROUP}"
#: ``apiVersion`` of a DDPJob manifest.
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

LABEL_JOB_NAME = f"{API_GROUP}/job-name"
LABEL_NODE_RANK = f"{API_GROUP}/node-rank"
LABEL_RESTART_ATTEMPT = f"{API_GROUP}/restart-attempt"
#: The container's restartCount the operator has accounted for (kubelet restarts in place).
LABEL_CONTAINER_RESTARTS = f"{API_GROUP}/container-restarts"
#: The attempt a container started by the kubelet sees as DDPJOB_RESTART_ATTEMPT (a fieldRef:
#: the kubelet reads it at each container start; the operator sets it to the next attempt once
#: the pod runs the current one).
ANNOTATION_ATTEMPT_AT_START = f"{API_GROUP}/attempt-at-start"

#: The one container of every pod (logs: ``kubectl logs <pod> -c trainer``).
CONTAINER_NAME = "trainer"
#: The memory-backed /dev/shm volume the operator adds to every pod; the schema refuses a
#: template volume of this name.
SHM_VOLUME_NAME = "dshm"
#: The Service port that carries the rendezvous.
RENDEZVOUS_PORT_NAME = "rendezvous"


def node_pod_name(job_name: str, node_rank: int) -> str:
    """Deterministic pod name (and hostname) of one node of a job."""
    return f"{job_name}-node-{node_rank}"


def service_name(job_name: str) -> str:
    """The headless Service of a job has the job's name."""
    return job_name


def master_address(job_name: str, service_name: str, namespace: str) -> str:
    """The DNS name of node 0: ``<pod hostname>.<headless service>.<namespace>.svc``.

    Resolves through the cluster DNS because node 0's pod has ``hostname=<job>-node-0`` and
    ``subdomain=<service>`` and the headless Service publishes not-ready addresses.
    """
    return f"{node_pod_name(job_name, 0)}.{service_name}.{namespace}.svc"
