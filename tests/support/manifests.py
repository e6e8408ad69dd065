"""Valid and invalid DDPJob manifests, shared by two test suites.

The unit tests feed them to ``ddpjob validate`` (``ddpjob.api.validation``); the cluster suite sends
the same manifests to a real API server with the generated CRD installed. The two word their
messages differently, so each bad case records the *field path* both must name, plus a
substring of ``ddpjob validate``'s message, plus what the API server is expected to do
(``server``):

* ``REJECTS``: a create is refused, naming ``path``.
* ``REJECTS_WHEN_STRICT``: refused only with server-side field validation ``Strict`` (what
  ``kubectl apply`` uses by default); with ``Ignore`` the API server prunes the unknown field.
* ``NOT_SENDABLE``: not a DDPJob at all (wrong kind or apiVersion): the API server routes it to
  another resource, so only ``ddpjob validate`` can judge it.

Pure data, standard library only: importable from any test tier.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

REJECTS = "rejects"
REJECTS_WHEN_STRICT = "rejects-when-strict"
NOT_SENDABLE = "not-sendable"

DELETE = object()  # a with_changes value: remove the field


def minimal_manifest(name: str = "mnist") -> dict:
    """The smallest valid DDPJob."""
    return {
        "apiVersion": "ddpjob.dev/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {"nnodes": 2, "image": "ddpjob-trainer:latest"},
    }


def with_changes(changes: dict[str, Any], base: dict | None = None) -> dict:
    """A copy of ``base`` (default: the minimal manifest) with dotted paths set or deleted.

    ``{"spec.nnodes": 0}`` sets a field, ``{"spec.image": DELETE}`` removes it; missing
    parents are created.
    """
    manifest = copy.deepcopy(base if base is not None else minimal_manifest())
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = manifest
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return manifest




@dataclass(frozen=True)
class BadCase:
    id: str
    manifest: dict
    path: str
    message: str
    server: str = REJECTS
    # The field path the API server's refusal names, where it differs from ``path`` (checked
    # against a real API server; see ``api_path``).
    server_path: str | None = None

    @property
    def api_path(self) -> str:
        """The field path the API server names when it refuses this manifest."""
        return self.server_path or self.path


def _bad(id: str, changes: dict[str, Any], path: str, message: str, server: str = REJECTS,
         server_path: str | None = None) -> BadCase:
    return BadCase(id, with_changes(changes), path, message, server, server_path)


_GPU = "nvidia.com/gpu"


def bad_manifest_table() -> list[BadCase]:
    """Invalid DDPJobs, one problem each, with the field path both validators must name."""
    return [
        _bad("nnodes-zero", {"spec.nnodes": 0}, "spec.nnodes", "must be >= 1, got 0"),
        _bad("nnodes-too-many", {"spec.nnodes": 10000}, "spec.nnodes", "must be <= 9999, got 10000"),
        _bad("nnodes-string", {"spec.nnodes": "2"}, "spec.nnodes", 'must be an integer, got string "2"'),
        _bad("nnodes-missing", {"spec.nnodes": DELETE}, "spec.nnodes", "required"),
        _bad("image-missing", {"spec.image": DELETE}, "spec.image", "required"),
        _bad("image-empty", {"spec.image": ""}, "spec.image", "must be at least 1 character long"),
        _bad("device-tpu", {"spec.device": "tpu"}, "spec.device", "must be one of cpu, gpu, got 'tpu'"),
        _bad("nproc-zero", {"spec.nprocPerNode": 0}, "spec.nprocPerNode", "must be >= 1"),
        _bad("nproc-too-many", {"spec.nprocPerNode": 65}, "spec.nprocPerNode", "must be <= 64"),
        _bad("pull-policy-lowercase", {"spec.imagePullPolicy": "always"}, "spec.imagePullPolicy",
             "must be one of Always, IfNotPresent, Never, got 'always'"),
        _bad("command-empty", {"spec.command": []}, "spec.command", "must have at least 1 item"),
        _bad("args-a-string", {"spec.args": "--epochs 3"}, "spec.args", "must be a list, got string"),
        _bad("args-number", {"spec.args": ["--epochs", 3]}, "spec.args[1]",
             'must be a string, got integer 3 (quote it in YAML: "3")'),
        _bad("unknown-spec-field", {"spec.workers": 2}, "spec.workers", "unknown field", REJECTS_WHEN_STRICT),
        _bad("unknown-top-level-field", {"extra": 1}, "extra", "unknown field", REJECTS_WHEN_STRICT),
        _bad("spec-missing", {"spec": DELETE}, "spec", "required"),
        _bad("spec-a-list", {"spec": [1]}, "spec", "must be a mapping, got a list"),
        _bad("master-port-privileged", {"spec.masterPort": 80}, "spec.masterPort", "must be >= 1024"),
        _bad("master-port-too-big", {"spec.masterPort": 70000}, "spec.masterPort", "must be <= 65535"),
        _bad("master-port-is-the-progress-port", {"spec.masterPort": 29400}, "spec.masterPort",
             "must not be 29400: every pod serves its progress reports on that port"),
        _bad("max-restarts-negative", {"spec.failurePolicy": {"maxRestarts": -1}},
             "spec.failurePolicy.maxRestarts", "must be >= 0"),
        _bad("max-disruptions-too-many", {"spec.failurePolicy": {"maxDisruptions": 101}},
             "spec.failurePolicy.maxDisruptions", "must be <= 100"),
        _bad("disruption-window-zero", {"spec.failurePolicy": {"disruptionWindowSeconds": 0}},
             "spec.failurePolicy.disruptionWindowSeconds", "must be >= 60"),
        _bad("disruption-window-a-second", {"spec.failurePolicy": {"disruptionWindowSeconds": 1}},
             "spec.failurePolicy.disruptionWindowSeconds", "must be >= 60"),
        _bad("exclude-node-after-negative", {"spec.failurePolicy": {"excludeNodeAfterFailures": -1}},
             "spec.failurePolicy.excludeNodeAfterFailures", "must be >= 0"),
        _bad("exclude-node-after-beyond-the-history", {"spec.failurePolicy": {"excludeNodeAfterFailures": 11}},
             "spec.failurePolicy.excludeNodeAfterFailures", "must be <= 10"),
        _bad("exit-code-repeated", {"spec.failurePolicy": {"permanentExitCodes": [2, 2]}},
             "spec.failurePolicy.permanentExitCodes[1]", "duplicate value 2"),
        _bad("exit-code-zero", {"spec.failurePolicy": {"permanentExitCodes": [0]}},
             "spec.failurePolicy.permanentExitCodes[0]", "must be >= 1"),
        _bad("exit-code-too-big", {"spec.failurePolicy": {"permanentExitCodes": [256]}},
             "spec.failurePolicy.permanentExitCodes[0]", "must be <= 255"),
        _bad("env-without-name", {"spec.env": [{"name": "A", "value": "1"}, {"value": "x"}]},
             "spec.env[1].name", "required"),
        _bad("env-bad-name", {"spec.env": [{"name": "1X", "value": "1"}]}, "spec.env[0].name",
             "must match the pattern"),
        _bad("env-value-number", {"spec.env": [{"name": "SEED", "value": 1}]}, "spec.env[0].value",
             "must be a string, got integer 1"),
        _bad("env-unknown-key", {"spec.env": [{"name": "A", "valu": "1"}]}, "spec.env[0].valu",
             "unknown field", REJECTS_WHEN_STRICT),
        _bad("env-reserved-name", {"spec.env": [{"name": "MASTER_ADDR", "value": "x"}]}, "spec.env[0].name",
             "env may not set the names the operator sets"),
        _bad("env-reserved-prefix", {"spec.env": [{"name": "PET_RDZV_BACKEND", "value": "c10d"}]},
             "spec.env[0].name", "env may not set the names the operator sets"),
        _bad("env-reserved-second-entry", {"spec.env": [{"name": "SEED", "value": "1"},
                                                        {"name": "WORLD_SIZE", "value": "8"}]},
             "spec.env[1].name", "env may not set the names the operator sets"),
        # A pod keeps the last of two equal names without a word; the API server refuses them
        # (x-kubernetes-list-type: map keyed by name).
        _bad("env-name-repeated", {"spec.env": [{"name": "SEED", "value": "1"}, {"name": "LR", "value": "0.1"},
                                                {"name": "SEED", "value": "2"}]},
             "spec.env[2]", 'duplicate entry: name "SEED" is also env[0]'),
        _bad("gpu-limit-on-cpu-job", {"spec.resources": {"limits": {_GPU: 1}}}, "spec.resources.limits",
             "only allowed with device: gpu"),
        _bad("gpu-request-on-cpu-job", {"spec.resources": {"requests": {_GPU: 1}}},
             "spec.resources.requests", "only allowed with device: gpu"),
        _bad("gpu-limit-not-nproc", {"spec.device": "gpu", "spec.nprocPerNode": 8,
                                     "spec.resources": {"limits": {_GPU: 4}}},
             "spec.resources.limits", "must equal nprocPerNode"),
        _bad("gpu-request-not-nproc", {"spec.device": "gpu", "spec.nprocPerNode": 8,
                                       "spec.resources": {"requests": {_GPU: "4"}}},
             "spec.resources.requests", "must equal nprocPerNode"),
        _bad("quantity-not-a-quantity", {"spec.resources": {"limits": {"memory": "lots"}}},
             "spec.resources.limits.memory", "must match the pattern"),
        _bad("quantity-a-float", {"spec.resources": {"requests": {"cpu": 0.5}}},
             "spec.resources.requests.cpu", "must be an integer or a string"),
        _bad("resources-typo", {"spec.resources": {"limit": {"cpu": 1}}}, "spec.resources.limit",
             "unknown field", REJECTS_WHEN_STRICT),
        _bad("mount-without-volume", {"spec.volumeMounts": [{"name": "data", "mountPath": "/data"}]},
             "spec.volumeMounts", "must name a volume in template.spec.volumes"),
        _bad("mount-over-dev-shm", {"spec.volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                                    "spec.template": {"spec": {"volumes": [{"name": "shm", "emptyDir": {}}]}}},
             "spec.volumeMounts", "set shmSize instead"),
        _bad("mount-without-path", {"spec.volumeMounts": [{"name": "data"}],
                                    "spec.template": {"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}}},
             "spec.volumeMounts[0].mountPath", "required"),
        _bad("volume-without-name", {"spec.template": {"spec": {"volumes": [{"emptyDir": {}}]}}},
             "spec.template.spec.volumes[0].name", "required"),
        _bad("volume-names-repeated", {"spec.template": {"spec": {"volumes": [
            {"name": "data", "emptyDir": {}}, {"name": "data", "emptyDir": {}}]}}},
             "spec.template.spec.volumes", "volume names must be unique"),
        _bad("volume-named-like-the-shm-volume", {"spec.template": {"spec": {"volumes": [
            {"name": "dshm", "emptyDir": {}}]}}}, "spec.template.spec.volumes", "is the operator's"),
        _bad("shm-size-decimal-unit", {"spec.shmSize": "2GB"}, "spec.shmSize", "must match the pattern"),
        _bad("shm-size-zero", {"spec.shmSize": "0"}, "spec.shmSize", "must match the pattern"),
        _bad("pod-label-reserved", {"spec.template": {"metadata": {"labels": {"ddpjob.dev/job-name": "x"}}}},
             "spec.template.metadata.labels", "set by the operator"),
        _bad("pod-label-number", {"spec.template": {"metadata": {"labels": {"version": 1.5}}}},
             "spec.template.metadata.labels.version", "must be a string, got number 1.5"),
        # Strict field validation prunes first: a mapping's keys are unknown fields of a list.
        _bad("tolerations-a-mapping", {"spec.template": {"spec": {"tolerations": {"key": "gpu"}}}},
             "spec.template.spec.tolerations", "must be a list, got a mapping",
             server_path="spec.template.spec.tolerations.key"),
        _bad("node-selector-a-list", {"spec.template": {"spec": {"nodeSelector": ["gpu"]}}},
             "spec.template.spec.nodeSelector", "must be a mapping, got a list"),
        _bad("grace-period-too-long", {"spec.template": {"spec": {"terminationGracePeriodSeconds": 7200}}},
             "spec.template.spec.terminationGracePeriodSeconds", "must be <= 3600"),
        _bad("suspend-a-string", {"spec.suspend": "true"}, "spec.suspend", "must be a boolean"),
        _bad("clean-pod-policy-unknown", {"spec.cleanPodPolicy": "Never"}, "spec.cleanPodPolicy",
             "must be one of Running, All, None"),
        _bad("startup-timeout-zero", {"spec.startupTimeoutSeconds": 0}, "spec.startupTimeoutSeconds",
             "must be >= 1"),
        _bad("deadline-zero", {"spec.activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", "must be >= 1"),
        _bad("ttl-negative", {"spec.ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished",
             "must be >= 0"),
        _bad("name-too-long", {"metadata.name": "a" * 54}, "metadata.name", "at most 53 characters"),
        _bad("name-starts-with-digit", {"metadata.name": "1job"}, "metadata.name", "DNS-1035 label"),
        _bad("name-with-dot", {"metadata.name": "my.job"}, "metadata.name", "DNS-1035 label"),
        _bad("metadata-typo", {"metadata.lables": {"team": "vision"}}, "metadata.lables", "unknown field",
             REJECTS_WHEN_STRICT),
        _bad("label-value-with-space", {"metadata.labels": {"team": "vision team"}}, "metadata.labels",
             'invalid value "vision team" of label "team"'),
        _bad("label-key-bad-prefix", {"metadata.labels": {"Example.com/team": "vision"}}, "metadata.labels",
             'invalid label key "Example.com/team": the prefix'),
        _bad("annotation-key-with-space", {"metadata.annotations": {"my note": "x"}}, "metadata.annotations",
             'invalid annotation key "my note"'),
        _bad("status-unknown-field", {"status": {"phase": "Running", "anything": 1}}, "status.anything",
             "unknown field", REJECTS_WHEN_STRICT),
        # The launch styles (docs/launch-styles.md): no combination gives an incoherent world.
        _bad("own-command-with-two-processes-per-pod",
             {"spec.nprocPerNode": 2, "spec.command": ["python", "/workspace/mnist.py"]},
             "spec.command", "a command of your own runs once per pod, but nprocPerNode > 1"),
        # A command is a recognised launcher only as written (ddpjob.api.launchers).
        _bad("python-module-not-a-launcher-two-processes",
             {"spec.nprocPerNode": 2, "spec.command": ["python", "-m", "train"]},
             "spec.command", "a command of your own runs once per pod, but nprocPerNode > 1"),
        _bad("launcher-name-as-a-script-argument",
             {"spec.nprocPerNode": 2, "spec.command": ["python", "train.py", "-m", "torch.distributed.run"]},
             "spec.command", "a command of your own runs once per pod, but nprocPerNode > 1"),
        _bad("launcher-inside-a-shell",
             {"spec.nprocPerNode": 2, "spec.command": ["bash", "-c", "torchrun train.py"]},
             "spec.command", "a command of your own runs once per pod, but nprocPerNode > 1"),
        _bad("a-program-named-like-torchrun",
             {"spec.nprocPerNode": 2, "spec.command": ["/opt/my-torchrun"]},
             "spec.command", "a command of your own runs once per pod, but nprocPerNode > 1"),
        _bad("launcher-torchrun-with-torchrun-command",
             {"spec.launcher": "torchrun", "spec.nprocPerNode": 2, "spec.command": ["torchrun", "train.py"]},
             "spec.launcher", "launcher torchrun and spawn are the pod entry point's"),
        _bad("launcher-torchrun-with-own-command",
             {"spec.launcher": "torchrun", "spec.command": ["python", "train.py"]},
             "spec.launcher", "launcher torchrun and spawn are the pod entry point's"),
        _bad("launcher-none-without-command", {"spec.launcher": "none"}, "spec.launcher",
             "launcher: none runs a command of your own as written: set command"),
        _bad("local-rank-flag-with-spawn", {"spec.launcher": "spawn", "spec.localRankFlag": "--local_rank"},
             "spec.localRankFlag", "localRankFlag is passed by the pod entry point's torchrun launcher"),
        _bad("local-rank-flag-with-own-command",
             {"spec.command": ["python", "train.py"], "spec.localRankFlag": "--local-rank"},
             "spec.localRankFlag", "localRankFlag is passed by the pod entry point's torchrun launcher"),
        _bad("launcher-unknown", {"spec.launcher": "mpirun"}, "spec.launcher",
             "must be one of torchrun, spawn, none, got 'mpirun'"),
        _bad("local-rank-flag-unknown", {"spec.localRankFlag": "--rank"}, "spec.localRankFlag",
             "must be one of --local_rank, --local-rank, got '--rank'"),
        _bad("wrong-api-version", {"apiVersion": "ddpjob.dev/v1"}, "apiVersion",
             "must be ddpjob.dev/v1alpha1", NOT_SENDABLE),
        _bad("wrong-kind", {"kind": "Job"}, "kind", "must be DDPJob (got kind 'Job')", NOT_SENDABLE),
    ]


def good_manifest_table() -> list[tuple[str, dict]]:
    """Valid DDPJobs that exercise every field (examples/*.yaml are added by the tests)."""
    full = with_changes({
        "metadata.namespace": "ml",
        "metadata.labels": {"team": "vision"},
        "spec": {
            "nnodes": 4, "nprocPerNode": 2, "device": "cpu", "image": "registry.example/train:1.0",
            "imagePullPolicy": "Always", "command": ["torchrun"], "args": ["train.py", "--epochs", "3"],
            "launcher": "none",  # torchrun starts the nprocPerNode processes itself
            "env": [{"name": "SEED", "value": "1"},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            "resources": {"requests": {"cpu": 2, "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            "shmSize": "8Gi",
            "template": {
                "metadata": {"labels": {"app": "train"}, "annotations": {"note": "x"}},
                "spec": {
                    "nodeSelector": {"pool": "cpu"},
                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml",
                                     "effect": "NoSchedule"}],
                    "affinity": {"nodeAffinity": {}},
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                    "serviceAccountName": "trainer", "priorityClassName": "high",
                    "schedulerName": "volcano", "runtimeClassName": "runc",
                    "imagePullSecrets": [{"name": "regcred"}],
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                    "terminationGracePeriodSeconds": 120,
                },
            },
            "masterPort": 23456,
            "failurePolicy": {"maxRestarts": 5, "permanentExitCodes": [2, 3]},
            "startupTimeoutSeconds": 900, "activeDeadlineSeconds": 86400,
            "ttlSecondsAfterFinished": 3600, "suspend": False, "cleanPodPolicy": "All",
        },
    })
    return [
        ("minimal", minimal_manifest()),
        ("every-field", full),
        ("gpu-limit-int", with_changes({"spec.device": "gpu", "spec.nprocPerNode": 8,
                                        "spec.resources": {"limits": {_GPU: 8}}})),
        ("gpu-limit-string", with_changes({"spec.device": "gpu", "spec.nprocPerNode": 8,
                                           "spec.resources": {"limits": {_GPU: "8"}, "requests": {_GPU: 8}}})),
        ("gpu-without-resources", with_changes({"spec.device": "gpu", "spec.nprocPerNode": 4})),
        ("local-rank-flag", with_changes({"spec.nprocPerNode": 4, "spec.localRankFlag": "--local_rank",
                                          "spec.launcher": "torchrun", "spec.args": ["--script", "t.py"]})),
        ("mp-spawn-one-node", with_changes({"spec.nnodes": 1, "spec.nprocPerNode": 2, "spec.launcher": "spawn",
                                            "spec.args": ["--script", "spawn.py"]})),
        ("pod-entry-as-command", with_changes({"spec.nprocPerNode": 2, "spec.localRankFlag": "--local-rank",
                                               "spec.command": ["/opt/venv/bin/ddptrain-pod"],
                                               "spec.args": ["--script", "t.py"]})),
        ("own-command-one-process", with_changes({"spec.command": ["python", "train.py"]})),
        # Launchers that start nprocPerNode processes themselves (ddpjob.api.launchers).
        ("torchrun-command-two-processes", with_changes({"spec.nprocPerNode": 2,
                                                         "spec.command": ["torchrun", "train.py"]})),
        ("torchrun-at-a-path-with-flags", with_changes({
            "spec.nprocPerNode": 4, "spec.command": ["/usr/local/bin/torchrun", "--log-dir=/tmp/l"],
            "spec.args": ["train.py", "--epochs", "3"]})),
        ("python-m-torch-distributed-run", with_changes({
            "spec.nprocPerNode": 2, "spec.command": ["python3", "-m", "torch.distributed.run", "train.py"]})),
        ("python-u-m-torch-distributed-launch", with_changes({
            "spec.nprocPerNode": 2,
            "spec.command": ["/usr/bin/python3.11", "-u", "-m", "torch.distributed.launch", "--use-env", "t.py"]})),
        ("name-53-characters", with_changes({"metadata.name": "a" * 53})),
        ("nulls-mean-unset", with_changes({"spec.command": None, "spec.template": None,
                                           "spec.activeDeadlineSeconds": None})),
        # `kubectl get -o yaml` output: the API server drops status on create, unchecked.
        ("with-status", with_changes({"status": {"phase": "Running", "ready": "2/2", "restarts": 0,
                                                 "conditions": [{"type": "Running", "status": "True"}]}})),
        ("status-values-are-not-checked", with_changes({"status": {"phase": "Bogus", "restarts": "x"}})),
        ("labels-and-annotations", with_changes({"metadata.labels": {"example.com/team": "vision", "empty": ""},
                                                 "metadata.annotations": {"Note": "any text: 1 2 3"}})),
        ("operator-view", with_changes({"metadata": {"name": "j", "namespace": "ns", "uid": "u-1",
                                                     "generation": 3, "resourceVersion": "7",
                                                     "annotations": {"a": "b"}}})),
    ]


def several_problems_case() -> tuple[dict, dict[str, str]]:
    """One manifest with problems of every kind at once (a field bound, a field pattern, rules
    on the object, on the spec and on an env entry): (manifest, {field path: message part}).
    Both judges name every one of them in one answer."""
    manifest = with_changes({"metadata.name": "Bad-Name", "spec.nnodes": 0, "spec.shmSize": "2GB",
                             "spec.resources": {"limits": {_GPU: 1}},
                             "spec.env": [{"name": "SEED", "value": "1"}, {"name": "RANK", "value": "0"}]})
    return manifest, {"metadata.name": "DNS-1035 label", "spec.nnodes": "must be >= 1",
                      "spec.shmSize": "must match the pattern",
                      "spec.resources.limits": "only allowed with device: gpu",
                      "spec.env[1].name": "env may not set the names the operator sets"}


@dataclass(frozen=True)
class UpdateCase:
    """An edit of a stored DDPJob: ``old`` (with the status the operator wrote) replaced by
    ``new``. ``path`` is the field the refusal names, None when the edit is allowed."""

    id: str
    old: dict
    new: dict
    path: str | None
    message: str = ""


_IMMUTABLE = "cannot change while the job runs"


def _update(id: str, phase: str, changes: dict[str, Any], path: str | None = None,
            old_changes: dict[str, Any] | None = None) -> UpdateCase:
    old = with_changes(old_changes or {})
    if phase:
        old["status"] = {"phase": phase}
    new = with_changes(changes, old)
    new.pop("status", None)
    return UpdateCase(id, old, new, path, _IMMUTABLE if path else "")


def update_table() -> list[UpdateCase]:
    """Edits of a stored job: what may change while an attempt is active (status.phase Pending,
    Running or Restarting), and what may change once it is Suspended or finished."""
    return [
        _update("grow-while-running", "Running", {"spec.nnodes": 3}, "spec.nnodes"),
        _update("shrink-while-pending", "Pending", {"spec.nnodes": 1}, "spec.nnodes"),
        _update("image-while-restarting", "Restarting", {"spec.image": "other:2"}, "spec.image"),
        _update("env-while-running", "Running", {"spec.env": [{"name": "SEED", "value": "2"}]}, "spec.env"),
        _update("node-selector-while-running", "Running",
                {"spec.template": {"spec": {"nodeSelector": {"pool": "b"}}}}, "spec.template"),
        _update("command-set-while-running", "Running", {"spec.command": ["python", "train.py"]},
                "spec.command"),
        _update("command-removed-while-running", "Running", {"spec.command": DELETE}, "spec.command",
                old_changes={"spec.command": ["python", "train.py"]}),
        _update("startup-timeout-while-running", "Running", {"spec.startupTimeoutSeconds": 60},
                "spec.startupTimeoutSeconds"),
        # Allowed: the fields that steer the operator and no pod, at any time.
        _update("suspend-while-running", "Running", {"spec.suspend": True}),
        _update("budget-while-running", "Running", {"spec.failurePolicy": {"maxRestarts": 9}}),
        _update("deadline-while-running", "Running", {"spec.activeDeadlineSeconds": 600}),
        _update("ttl-and-cleanup-while-running", "Running", {"spec.ttlSecondsAfterFinished": 60,
                                                             "spec.cleanPodPolicy": "All"}),
        # Allowed: anything while suspended (Kueue sets nodeSelector and tolerations then), in
        # the edit that suspends, and once the job has finished (the operator ignores it).
        _update("reshape-while-suspended", "Suspended",
                {"spec.nnodes": 4, "spec.template": {"spec": {"nodeSelector": {"pool": "b"},
                                                             "tolerations": [{"key": "k", "operator": "Exists"}]}}}),
        _update("resume-reshaped", "Suspended", {"spec.nnodes": 4, "spec.suspend": False},
                old_changes={"spec.suspend": True}),
        _update("suspend-and-reshape-in-one-edit", "Running", {"spec.nnodes": 4, "spec.suspend": True}),
        _update("edit-a-finished-job", "Failed", {"spec.image": "other:2"}),
        _update("edit-before-the-operator-saw-it", "", {"spec.nnodes": 5}),
    ]
