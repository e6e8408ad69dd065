"""The DDPJob API: the one source of truth.

These frozen dataclasses *are* the API. ``ddpjob.api.openapi`` reads their annotations and field
metadata (``model.spec_field``) to generate the CRD's structural OpenAPI schema
(manifests/crd.yaml is generated, never edited); ``ddpjob.api.validation`` checks a manifest
against that schema and parses it into these objects for ``ddpjob validate`` and the operator.
Cross-field rules are declared once, in each class's ``RULES`` (and the module-level rule
tuples below), as a CEL expression (for the API server) next to the equivalent Python
predicate (for ``ddpjob validate``); a test feeds the same bad manifests to both.

Why a Python twin rather than evaluating the CEL itself: cel-python 0.5.0 (``celpy``) does
evaluate every rule here correctly (they use only standard CEL: ``has``, ``size``, ``in``,
``string``, ``startsWith``/``endsWith``, ``matches``, ``all``/``exists``/``exists_one``, no
Kubernetes extension library); tests/unit/test_crd.py evaluates each rule with it and checks the
predicate agrees, on every case of the manifest and update tables that reaches the rules. But it
is an interpreter: compiling the 33 rules takes 0.4 s of CPU, and evaluating the 11 DDPJobSpec
rules on one manifest 23 ms, against 0.01 ms for the predicates and 6 ms for the whole of
``parse_ddpjob`` today (CPU time, on the dev machine): the operator parses every job on every
reconcile pass, which would become about five times as costly, and every ``ddpjob`` command
would start slower. It would also bring google-re2, pendulum, lark and jmespath into the
operator image, the CLI and the trainer image (pyproject.toml's base dependencies go into both
images). So cel-python stays a test dependency, the judge of the twins, and the real API server
has the last word (tests/cluster/test_api_validation.py).

Field names are the manifest's camelCase names, so a spec path in an error message is the
attribute path here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional

from ddpjob import contract
from ddpjob.api import launchers, names
from ddpjob.api.model import Rule, spec_field
from ddpjob.api.status import ACTIVE_PHASES

# Longest job name such that every child name is a DNS label (<= 63 characters):
# pod/hostname "<job>-node-<rank>" with ranks up to 4 digits -> 63 - len("-node-") - 4 = 53.
# The Service is named after the job; a DNS-1035 label (it must start with a letter).
MAX_JOB_NAME_LENGTH = 53
MAX_NNODES = 9999
MAX_NPROC_PER_NODE = 64
GPU_RESOURCE = "nvidia.com/gpu"
# Bounds the CEL cost of the launcher rules, which look at command[0].
MAX_COMMAND_ITEM_LENGTH = 4096


# Raw Kubernetes fragments copied into the pod unchanged. They keep unknown fields inside
# (the API server validates them when the operator creates the pod), but the DDPJob schema
# stays structural.
_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_QUANTITY = {"x-kubernetes-int-or-string": True, "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$", "anyOf": [{"type": "integer"}, {"type": "string"}]}
# Reserved env names not already covered by the reserved prefix (the rule checks both).
_RESERVED_UNPREFIXED = tuple(sorted(
    n for n in contract.RESERVED_ENV_NAMES if not n.startswith(contract.RESERVED_ENV_PREFIX)))
# On each env entry, so that a refusal names the entry (spec.env[1].name).
ENV_VAR_RULES = (
    Rule(
        cel="!self.name.startsWith('" + contract.RESERVED_ENV_PREFIX + "') && !(self.name in "
        + "[" + ", ".join(f"'{n}'" for n in _RESERVED_UNPREFIXED) + "])",
        message="env may not set the names the operator sets: " + contract.RESERVED_ENV_PREFIX + "*, "
        + ", ".join(_RESERVED_UNPREFIXED),
        check=lambda e: not e["name"].startswith(contract.RESERVED_ENV_PREFIX)
        and e["name"] not in contract.RESERVED_ENV_NAMES,
        field_path=".name",
    ),
)
ENV_VAR_SCHEMA = {
    "type": "object",
    "required": ["name"],
    "x-kubernetes-validations": [{"rule": r.cel, "message": r.message, "fieldPath": r.field_path}
                                 for r in ENV_VAR_RULES],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"},
        "value": {"type": "string"},
        "valueFrom": _OBJECT,
    },
}
RESOURCES_SCHEMA = {
    "type": "object",
    "properties": {
        "requests": {"description": "Resources the scheduler reserves, e.g. cpu: 4, memory: 16Gi.",
                     "type": "object", "additionalProperties": _QUANTITY},
        "limits": {"description": "Most the container may use, e.g. memory: 16Gi, nvidia.com/gpu: 8.",
                   "type": "object", "additionalProperties": _QUANTITY},
    },
}
VOLUME_MOUNT_SCHEMA = {
    "type": "object",
    "required": ["name", "mountPath"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 63},
        "mountPath": {"type": "string", "minLength": 1, "maxLength": 4096},
        "subPath": {"type": "string"},
        "readOnly": {"type": "boolean"},
    },
}
VOLUME_SCHEMA = {"type": "object", "required": ["name"], "x-kubernetes-preserve-unknown-fields": True,
                 "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 63}}}
# The API server refuses a CEL rule whose *estimated* cost is too high, and estimates an
# unbounded list as millions of items; the volumeMounts x volumes rule needs these bounds.
MAX_VOLUMES = 64
# The most disruptions failurePolicy may allow in its window: the status keeps the time of each
# one still in the window (status.recentDisruptions), so this bounds that list.
MAX_DISRUPTIONS = 100
# The shortest disruption window: with a window of a second, a budget of disruptions "within the
# window" never runs out, and a gang disrupted again and again (its own pods evicted through
# the Eviction API, say) would restart without end, each restart the operator's work.
MIN_DISRUPTION_WINDOW_SECONDS = 60
#: failurePolicy.excludeNodeAfterFailures counts in status.failureHistory, which keeps 10
#: (status.FAILURE_HISTORY_LIMIT; a unit test holds the two together).
MAX_EXCLUDE_AFTER = 10
#: failurePolicy.repeatedErrorAttempts compares the errors status.failureHistory keeps (10).
MAX_REPEATED_ERROR_ATTEMPTS = 10
# The operator's memory-backed /dev/shm volume in every pod.
SHM_VOLUME_NAME = names.SHM_VOLUME_NAME


@dataclass(frozen=True)
class FailurePolicy:
    maxRestarts: int = spec_field(
        "Gang restarts allowed after retryable failures of the job's own (its code, its "
        "configuration, a stall) before the job is Failed (RestartBudgetExhausted). Disruptions "
        "(maxDisruptions) do not count here.",
        default=3, minimum=0, maximum=1000)
    maxDisruptions: int = spec_field(
        "Gang restarts allowed after disruptions, failures the job's code did not cause: the "
        "pod's DisruptionTarget condition (preemption, the Eviction API and so a drain, a "
        "NoExecute taint of a NotReady or lost node, a node gone), a kubelet eviction or "
        "NodeLost, an unhealthy device in allocatedResourcesStatus. At most this many within any "
        "disruptionWindowSeconds; one more fails the job (DisruptionBudgetExhausted). They do "
        "not spend maxRestarts.",
        default=10, minimum=0, maximum=MAX_DISRUPTIONS)
    disruptionWindowSeconds: int = spec_field(
        "The sliding window maxDisruptions counts in: disruptions older than this many seconds "
        "no longer count. At least 60, so that the budget bounds how often the gang restarts: "
        "at most maxDisruptions (100 at most) a minute.",
        default=3600, minimum=MIN_DISRUPTION_WINDOW_SECONDS, maximum=86400 * 30)
    excludeNodeAfterFailures: int = spec_field(
        "Bad-node avoidance: a Kubernetes node implicated in this many of the job's recorded "
        "failures (status.failureHistory, the last 10: a rank's own non-zero exit there, not a "
        "143/12/13 that only follows another's failure; or the node's own disruption: NotReady, "
        "lost, a kubelet eviction, an unhealthy device) is listed in status.excludedNodes and the "
        "next attempts' pods avoid it (a required node affinity). 0: never.",
        default=2, minimum=0, maximum=MAX_EXCLUDE_AFTER)
    restartMode: str = spec_field(
        "How a gang restart after a retryable failure is done. InPlace: the pods that still "
        "exist stay (same pods, nodes, IPs, volumes, Kueue admission) and their entry point "
        "(ddptrain-pod) starts the next attempt's processes; only pods that are gone, or whose "
        "container exited, are recreated. Recreate: every pod of the gang is deleted and created "
        "again. A command of your own (launcher none) has no entry point to take the order: "
        "under InPlace its container carries the kubelet's restart rule (Kubernetes 1.35+), so "
        "a retryable exit restarts it in its pod; peers that do not exit too are recreated "
        "after 30 s, and a cluster without the rules recreates the gang.",
        default=contract.RESTART_MODE_IN_PLACE, enum=contract.RESTART_MODES)
    permanentExitCodes: tuple[int, ...] = spec_field(
        "Container exit codes that fail the job at once (a restart cannot fix them). Every other "
        "non-zero exit, a signal, an eviction or a deleted pod is retryable. Default: the "
        "trainer's bad-configuration (2), data-missing (3) and disk-full (4) codes, and 126/127.",
        default=contract.DEFAULT_PERMANENT_EXIT_CODES, minimum=1, maximum=255, max_items=64,
        unique_items=True)
    repeatedErrorAttempts: int = spec_field(
        "A deterministic error fails the job (RepeatedError) instead of spending maxRestarts: the "
        "same error (the Python exception the culprit's termination message names, digits aside) "
        "on this many attempts in a row, each an exit of the code's own (not a signal, not 143, 12 "
        "or 13) before the attempt trained (before its first progress report; for a program that "
        "reports none, within 5 minutes of its start). 2: one restart, in case it was bad luck; "
        "1: the first such failure fails the job; 0: never.",
        default=2, minimum=0, maximum=MAX_REPEATED_ERROR_ATTEMPTS)
    progressTimeoutSeconds: Optional[int] = spec_field(
        "Hang detection: once a rank has reported progress (docs/contract.md, Progress), the "
        "longest the job may go without any rank reporting progress. Then the gang counts as "
        "failed (reason Stalled, retryable): it restarts from its last checkpoint and the "
        "restart counts against maxRestarts. Unset: no limit.",
        default=None, minimum=1, maximum=86400 * 7)
    firstProgressTimeoutSeconds: Optional[int] = spec_field(
        "Hang detection before the first report: the longest from every pod Running to the "
        "first progress report of the attempt (a rendezvous or an init that never completes). "
        "Then the gang counts as failed, as for progressTimeoutSeconds. Set it only for "
        "programs that report progress. Unset: no limit.",
        default=None, minimum=1, maximum=86400 * 7)


@dataclass(frozen=True)
class PodMetadata:
    labels: Mapping[str, str] = spec_field(
        f"Labels added to every pod (keys under {names.API_GROUP}/ are the operator's).",
        default_factory=dict)
    annotations: Mapping[str, str] = spec_field("Annotations added to every pod.", default_factory=dict)

    # The operator's labels select the pods (Service selector, restart bookkeeping).
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=f"!has(self.labels) || self.labels.all(k, !k.startsWith('{names.API_GROUP}/'))",
            message=f"labels under {names.API_GROUP}/ are set by the operator",
            check=lambda m: not any(k.startswith(f"{names.API_GROUP}/") for k in m["labels"]),
            field_path=".labels",
        ),
    )


@dataclass(frozen=True)
class PodTemplateSpec:
    nodeSelector: Mapping[str, str] = spec_field("Pod nodeSelector.", default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = spec_field(
        "Pod tolerations (core/v1 Toleration).", default=(), openapi=_OBJECT)
    affinity: Optional[Mapping[str, Any]] = spec_field(
        "Pod affinity (core/v1 Affinity).", default=None, openapi=_OBJECT)
    volumes: tuple[Mapping[str, Any], ...] = spec_field(
        "Extra pod volumes (core/v1 Volume), mounted with spec.volumeMounts.", default=(),
        openapi=VOLUME_SCHEMA, max_items=MAX_VOLUMES)
    serviceAccountName: Optional[str] = spec_field("Pod service account.", default=None, max_length=253)
    priorityClassName: Optional[str] = spec_field("Pod priority class.", default=None, max_length=253)
    schedulerName: Optional[str] = spec_field(
        "Scheduler for the pods (e.g. a gang scheduler).", default=None, max_length=253)
    runtimeClassName: Optional[str] = spec_field("Pod runtime class.", default=None, max_length=253)
    imagePullSecrets: tuple[Mapping[str, Any], ...] = spec_field(
        "Image pull secrets (core/v1 LocalObjectReference).", default=(), openapi=_OBJECT)
    securityContext: Optional[Mapping[str, Any]] = spec_field(
        "Pod securityContext; replaces the default, which satisfies the 'restricted' Pod "
        "Security profile (non-root, no privilege escalation, all capabilities dropped, "
        "RuntimeDefault seccomp).", default=None, openapi=_OBJECT)
    terminationGracePeriodSeconds: int = spec_field(
        "Seconds a pod has after SIGTERM to write its checkpoint before SIGKILL.",
        default=30, minimum=0, maximum=3600)

    # Caught here rather than as a pod the API server refuses after the job was accepted.
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
            message="volume names must be unique",
            check=lambda t: len({v["name"] for v in t["volumes"]}) == len(t["volumes"]),
            field_path=".volumes",
        ),
        Rule(
            cel=f"!has(self.volumes) || self.volumes.all(v, v.name != '{SHM_VOLUME_NAME}')",
            message=f"volume name {SHM_VOLUME_NAME} is the operator's (/dev/shm); choose another",
            check=lambda t: all(v["name"] != SHM_VOLUME_NAME for v in t["volumes"]),
            field_path=".volumes",
        ),
    )


@dataclass(frozen=True)
class PodTemplate:
    metadata: PodMetadata = spec_field("Pod labels and annotations.", default_factory=PodMetadata)
    spec: PodTemplateSpec = spec_field("Pod-level settings.", default_factory=PodTemplateSpec)


# A command other than the pod entry point runs as written, once per pod (api/command.py).
_OWN_COMMAND_CEL = f"(has(self.command) && !self.command[0].endsWith('{launchers.POD_ENTRY_PROGRAM}'))"

@dataclass(frozen=True)
class DDPJobSpec:
    nnodes: int = spec_field("Number of nodes: one pod each.", minimum=1, maximum=MAX_NNODES)
    image: str = spec_field("Container image of every pod.", min_length=1, max_length=512)
    nprocPerNode: int = spec_field(
        "Training processes per pod (per node); with device gpu, GPUs per pod.",
        default=1, minimum=1, maximum=MAX_NPROC_PER_NODE)
    device: str = spec_field("cpu (gloo) or gpu (NCCL, nvidia.com/gpu = nprocPerNode).",
                             default="cpu", enum=("cpu", "gpu"))
    imagePullPolicy: str = spec_field("Container imagePullPolicy.", default="IfNotPresent",
                                      enum=("Always", "IfNotPresent", "Never"))
    command: Optional[tuple[str, ...]] = spec_field(
        "Container command. Default: the trainer image's pod entry point "
        f"({' '.join(contract.DEFAULT_POD_COMMAND)}), which waits for the master and runs torchrun.",
        default=None, min_items=1, max_length=MAX_COMMAND_ITEM_LENGTH)
    args: tuple[str, ...] = spec_field(
        "Container args; with the default command, the trainer's options (ddptrain --help), or "
        "--script PATH [ARGS] / -m MODULE [ARGS] for your own script.",
        default=())
    launcher: Optional[str] = spec_field(
        "Who starts the pod's nprocPerNode training processes (docs/launch-styles.md). "
        "torchrun: the pod entry point starts nprocPerNode copies of the script (args: --script "
        "PATH), each with its own RANK, LOCAL_RANK and WORLD_SIZE. spawn: the pod entry point "
        "starts the script once and it starts its own nprocPerNode processes (torch "
        "multiprocessing.spawn). none: command runs as written, once per pod; with nprocPerNode "
        "> 1 it must start the processes itself: a command that is torchrun or python -m "
        "torch.distributed.run/launch does (from the PET_* variables) and needs no launcher; "
        "say launcher: none for any other (mp.spawn, a wrapper). Default: torchrun without "
        "command, none with one. torchrun and spawn check every init_process_group against the "
        "job's world and bound it by startupTimeoutSeconds (exit 12).",
        default=None, enum=contract.LAUNCHERS)
    localRankFlag: Optional[str] = spec_field(
        "For scripts written for torch.distributed.launch (argparse --local_rank without a "
        "default): the pod entry point passes FLAG=<local rank> to each process, right after "
        "the script, as that launcher did. --local_rank (before torch 2.0) or --local-rank. "
        "Only with launcher torchrun.",
        default=None, enum=contract.LOCAL_RANK_FLAGS)
    env: tuple[Mapping[str, Any], ...] = spec_field(
        "Extra environment variables (core/v1 EnvVar). Names the operator sets (MASTER_ADDR, "
        "RANK, PET_*, ...) are refused, and so is a name given twice.", default=(),
        openapi=ENV_VAR_SCHEMA, max_items=256, list_map_keys=("name",))
    resources: Mapping[str, Any] = spec_field(
        "Container resources (requests/limits). For device gpu, nvidia.com/gpu defaults to "
        "nprocPerNode and, if given, must equal it.", default_factory=dict, openapi=RESOURCES_SCHEMA)
    volumeMounts: tuple[Mapping[str, Any], ...] = spec_field(
        "Container volume mounts of template.spec.volumes.", default=(), openapi=VOLUME_MOUNT_SCHEMA,
        max_items=MAX_VOLUMES)
    shmSize: str = spec_field(
        "Size of the memory-backed /dev/shm every pod gets (DataLoader workers need more than "
        "the 64Mi default).", default="2Gi", pattern=r"^[1-9][0-9]*(Ki|Mi|Gi|Ti)?$")
    template: PodTemplate = spec_field("Pod template for everything else.", default_factory=PodTemplate)
    masterPort: int = spec_field("Rendezvous port on node 0.", default=contract.DEFAULT_MASTER_PORT,
                                 minimum=1024, maximum=65535)
    failurePolicy: FailurePolicy = spec_field("Restart budget and exit-code classification.",
                                              default_factory=FailurePolicy)
    startupTimeoutSeconds: int = spec_field(
        "Seconds for every pod to be Running (all scheduled, images pulled) before the job "
        "releases its pods and fails with reason StartupTimeout.", default=600, minimum=1,
        maximum=86400 * 7)
    activeDeadlineSeconds: Optional[int] = spec_field(
        "Seconds from the job's start after which it is stopped and Failed (DeadlineExceeded).",
        default=None, minimum=1)
    ttlSecondsAfterFinished: Optional[int] = spec_field(
        "Seconds after Succeeded or Failed after which the DDPJob (and its children) is deleted.",
        default=None, minimum=0)
    suspend: bool = spec_field("True deletes the pods and keeps the job Suspended until False.",
                               default=False)
    cleanPodPolicy: str = spec_field(
        "Pods to delete when the job ends: Running (default: free what still runs, keep finished "
        "pods for their logs), All, or None.", default="Running", enum=("Running", "All", "None"))

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.device == 'gpu' || !has(self.resources.limits) || !('nvidia.com/gpu' in self.resources.limits)",
            message="resources.limits['nvidia.com/gpu'] is only allowed with device: gpu",
            check=lambda s: s["device"] == "gpu" or GPU_RESOURCE not in (s["resources"].get("limits") or {}),
            field_path=".resources.limits",
        ),
        Rule(
            cel="self.device == 'gpu' || !has(self.resources.requests) || !('nvidia.com/gpu' in self.resources.requests)",
            message="resources.requests['nvidia.com/gpu'] is only allowed with device: gpu",
            check=lambda s: s["device"] == "gpu" or GPU_RESOURCE not in (s["resources"].get("requests") or {}),
            field_path=".resources.requests",
        ),
        # Quantities are int-or-string: compare as strings so 8 and "8" both match nprocPerNode.
        Rule(
            cel="self.device != 'gpu' || !has(self.resources.limits) || !('nvidia.com/gpu' in self.resources.limits) || string(self.resources.limits['nvidia.com/gpu']) == string(self.nprocPerNode)",
            message="resources.limits['nvidia.com/gpu'] must equal nprocPerNode (one GPU per process)",
            check=lambda s: _gpu_count_matches(s, "limits"),
            field_path=".resources.limits",
        ),
        Rule(
            cel="self.device != 'gpu' || !has(self.resources.requests) || !('nvidia.com/gpu' in self.resources.requests) || string(self.resources.requests['nvidia.com/gpu']) == string(self.nprocPerNode)",
            message="resources.requests['nvidia.com/gpu'] must equal nprocPerNode (one GPU per process)",
            check=lambda s: _gpu_count_matches(s, "requests"),
            field_path=".resources.requests",
        ),
        Rule(
            cel=f"self.masterPort != {contract.DEFAULT_PROGRESS_PORT}",
            message=f"must not be {contract.DEFAULT_PROGRESS_PORT}: every pod serves its progress "
            "reports on that port (DDPJOB_PROGRESS_PORT, docs/contract.md); choose another port",
            check=lambda s: s["masterPort"] != contract.DEFAULT_PROGRESS_PORT,
            field_path=".masterPort",
        ),
        # The launcher rules: no combination of command, launcher, localRankFlag and
        # nprocPerNode may give the processes an incoherent world (docs/launch-styles.md).
        Rule(
            cel=f"!{_OWN_COMMAND_CEL} || self.nprocPerNode == 1 || {launchers.LAUNCHER_CEL} || (has(self.launcher) && self.launcher == '{contract.LAUNCHER_NONE}')",
            message="a command of your own runs once per pod, but nprocPerNode > 1 makes WORLD_SIZE "
            "count processes that would never start (init_process_group would wait forever). "
            "Either leave command unset and give your script in args (--script PATH ARGS...): the "
            "pod entry point then starts nprocPerNode processes, each with its own RANK and "
            "LOCAL_RANK; or start it with a launcher DDPJob recognises (command: [torchrun, "
            "PATH], or python -m torch.distributed.run / torch.distributed.launch), which starts "
            "nprocPerNode processes from the PET_* variables; or, if your command starts them "
            "some other way (mp.spawn, a wrapper script), say so with launcher: none",
            check=lambda s: not _own_command(s) or s["nprocPerNode"] == 1
            or launchers.starts_processes_itself(s.get("command"))
            or s.get("launcher") == contract.LAUNCHER_NONE,
            field_path=".command",
        ),
        Rule(
            cel=f"!has(self.launcher) || self.launcher == '{contract.LAUNCHER_NONE}' || !{_OWN_COMMAND_CEL}",
            message="launcher torchrun and spawn are the pod entry point's: leave command unset and "
            "give your script in args (--script PATH ARGS... or -m MODULE ARGS...); launcher: none "
            "(or no launcher) runs a command of your own, a torchrun command included",
            check=lambda s: s.get("launcher") in (None, contract.LAUNCHER_NONE) or not _own_command(s),
            field_path=".launcher",
        ),
        Rule(
            cel=f"!has(self.launcher) || self.launcher != '{contract.LAUNCHER_NONE}' || {_OWN_COMMAND_CEL}",
            message="launcher: none runs a command of your own as written: set command, or choose "
            "launcher torchrun or spawn for the pod entry point",
            check=lambda s: s.get("launcher") != contract.LAUNCHER_NONE or _own_command(s),
            field_path=".launcher",
        ),
        Rule(
            cel=f"!has(self.localRankFlag) || ((!has(self.launcher) || self.launcher == '{contract.LAUNCHER_TORCHRUN}') && !{_OWN_COMMAND_CEL})",
            message="localRankFlag is passed by the pod entry point's torchrun launcher: leave "
            "command unset, give your script in args (--script PATH ARGS...), and leave launcher "
            "unset or torchrun",
            check=lambda s: not s.get("localRankFlag") or (
                s.get("launcher") in (None, contract.LAUNCHER_TORCHRUN) and not _own_command(s)),
            field_path=".localRankFlag",
        ),
        Rule(
            cel="self.volumeMounts.all(m, self.template.spec.volumes.exists(v, v.name == m.name))",
            message="every volumeMounts[].name must name a volume in template.spec.volumes",
            check=lambda s: all(
                any(v.get("name") == m["name"] for v in s["template"]["spec"]["volumes"])
                for m in s["volumeMounts"]
            ),
            field_path=".volumeMounts",
        ),
        Rule(
            cel="self.volumeMounts.all(m, m.mountPath != '/dev/shm' && m.mountPath != '/dev/shm/')",
            message="/dev/shm is mounted by the operator; set shmSize instead",
            check=lambda s: all(m["mountPath"].rstrip("/") != "/dev/shm" for m in s["volumeMounts"]),
            field_path=".volumeMounts",
        ),
    )


def _own_command(spec: Mapping[str, Any]) -> bool:
    """A command other than the pod entry point: it runs as written, once per pod."""
    return not launchers.is_pod_entry(spec.get("command"))


def effective_launcher(spec: DDPJobSpec) -> str:
    """spec.launcher, or its default: torchrun for the pod entry point, none for a command of
    your own (which runs as written: a torchrun command starts the processes itself)."""
    if spec.launcher:
        return spec.launcher
    return contract.LAUNCHER_TORCHRUN if launchers.is_pod_entry(spec.command) else contract.LAUNCHER_NONE


def effective_restart_mode(spec: DDPJobSpec) -> str:
    """failurePolicy.restartMode, where the pods run the entry point that can restart in place;
    Recreate for a command of your own (nothing in the pod would take the order)."""
    if spec.failurePolicy.restartMode == contract.RESTART_MODE_IN_PLACE and launchers.is_pod_entry(spec.command):
        return contract.RESTART_MODE_IN_PLACE
    return contract.RESTART_MODE_RECREATE


def kubelet_restarts_in_place(spec: DDPJobSpec) -> bool:
    """InPlace asked for a command of your own: nothing in the pod takes the operator's order;
    where the operator turns the kubelet's restart rules on (settings.kubelet_restart_rules),
    the container carries them instead (docs/operator.md)."""
    return (spec.failurePolicy.restartMode == contract.RESTART_MODE_IN_PLACE
            and not launchers.is_pod_entry(spec.command))


def _gpu_count_matches(spec: Mapping[str, Any], kind: str) -> bool:
    """With device gpu, a given nvidia.com/gpu request or limit equals nprocPerNode."""
    quantities = spec["resources"].get(kind) or {}
    return (spec["device"] != "gpu" or GPU_RESOURCE not in quantities
            or str(quantities[GPU_RESOURCE]) == str(spec["nprocPerNode"]))


# Rules on the whole object (self = the DDPJob): names must leave room for child names.
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_RULES = (
    Rule(
        cel=f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH}",
        message=f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters so that pod names "
        "(<name>-node-<rank>) are valid DNS labels",
        check=lambda o: len(o["metadata"]["name"]) <= MAX_JOB_NAME_LENGTH,
        field_path=".metadata.name",
    ),
    Rule(
        cel=f"self.metadata.name.matches('{DNS_1035_LABEL}')",
        message="metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', "
        "starting with a letter): it names the headless Service",
        check=lambda o: re.fullmatch(DNS_1035_LABEL, o["metadata"]["name"]) is not None,
        field_path=".metadata.name",
    ),
)

# --- Spec changes while an attempt runs ------------------------------------------------------
# A running gang is one shape: every pod got the same WORLD_SIZE, image, command and template.
# A change to any of these while an attempt is active (status.phase Pending, Running or
# Restarting) is refused by the API server; it is allowed while the job is Suspended or
# finished, or in the same request that suspends it (Kueue changes the nodeSelector and
# tolerations of a suspended job). These fields steer the operator, never a pod, and stay
# editable at any time:
MUTABLE_WHILE_ACTIVE = ("suspend", "activeDeadlineSeconds", "ttlSecondsAfterFinished",
                        "cleanPodPolicy", "failurePolicy")
_ACTIVE = ("has(oldSelf.status) && has(oldSelf.status.phase) && oldSelf.status.phase in ["
           + ", ".join(f"'{p}'" for p in ACTIVE_PHASES) + "]")


def is_active(obj: Mapping[str, Any]) -> bool:
    """Whether a stored DDPJob (a plain dict) has an attempt in progress."""
    return ((obj.get("status") or {}).get("phase") or "") in ACTIVE_PHASES


def _unchanged_rule(name: str, always_present: bool) -> Rule:
    same = (f"self.spec.{name} == oldSelf.spec.{name}" if always_present else
            f"(has(self.spec.{name}) ? has(oldSelf.spec.{name}) && self.spec.{name} == oldSelf.spec.{name}"
            f" : !has(oldSelf.spec.{name}))")
    return Rule(
        cel=f"!({_ACTIVE}) || self.spec.suspend || {same}",
        message="cannot change while the job runs (status.phase Pending, Running or "
        "Restarting): suspend the job (spec.suspend: true, possibly in the same edit) or wait "
        "until it has finished",
        check=lambda new, old, name=name: (not is_active(old) or new["spec"].get("suspend") is True
                                           or new["spec"].get(name) == old["spec"].get(name)),
        field_path=f".spec.{name}",
        transition=True,
    )


def _pod_shaping_fields() -> list[tuple[str, bool]]:
    """(field, always present after defaulting) for each DDPJobSpec field a pod is built from."""
    out = []
    for f in dataclasses.fields(DDPJobSpec):
        if f.name in MUTABLE_WHILE_ACTIVE:
            continue
        always = (f.metadata.get("required", False) or f.default_factory is not dataclasses.MISSING
                  or f.default not in (None, dataclasses.MISSING))
        out.append((f.name, bool(always)))
    return out


# Transition rules, at the root (they read oldSelf.status): one per pod-shaping field, so a
# refusal names the field. New fields are covered without a word here.
TRANSITION_RULES = tuple(_unchanged_rule(name, always) for name, always in _pod_shaping_fields())
# Every rule on the whole object (self = the DDPJob).
OBJECT_RULES = NAME_RULES + TRANSITION_RULES


def pod_spec_hash(job_spec: "DDPJobSpec") -> str:
    """A fingerprint of the pod-shaping part of a spec (every field but MUTABLE_WHILE_ACTIVE).
    The operator records it with each attempt, so it can tell a spec changed under a running
    gang (by an older CRD, or an edit that bypassed validation) and leave that gang alone."""
    # Fields left at their defaults are left out, so that a field added in a later release
    # (with a default) does not make every running job's recorded shape look changed.
    defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
                for f in dataclasses.fields(DDPJobSpec)}
    shape = {k: v for k, v in dataclasses.asdict(job_spec).items()
             if k not in MUTABLE_WHILE_ACTIVE and v is not None
             and not (defaults[k] is not dataclasses.MISSING and _same(v, defaults[k]))}
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _same(value: Any, default: Any) -> bool:
    if dataclasses.is_dataclass(default):
        default = dataclasses.asdict(default)
    return json.dumps(value, sort_keys=True, default=_plain) == json.dumps(default, sort_keys=True, default=_plain)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


@dataclass(frozen=True)
class DDPJob:
    """A parsed, validated DDPJob: what the operator, `ddpjob render` and `ddpjob run` consume."""

    name: str
    namespace: str
    uid: Optional[str]
    spec: DDPJobSpec
    labels: Mapping[str, str] = field(default_factory=dict)
