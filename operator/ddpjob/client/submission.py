"""What ``ddpjob submit`` sends: the ConfigMap of your code and the DDPJob that mounts it and
runs the entry script. Pure: options and a package in, plain manifests out (the same objects
``--dry-run`` prints, ``ddpjob validate`` checks and ``ddpjob run`` runs).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from ddpjob import __version__, contract
from ddpjob.api import names, spec
from ddpjob.client.code_package import CodePackage, build_configmap, build_volume

DEFAULT_IMAGE = f"localhost/ddpjob/trainer:{__version__}"  # what `make images` builds
DEFAULT_MOUNT_PATH = "/workspace/code"
CODE_VOLUME = "code"
#: On the ConfigMap: which job's code it is (``ddpjob submit`` replaces only its own).
LABEL_SUBMITTED_CODE = f"{names.API_GROUP}/code-of"
#: How the pods start the entry script: the pod entry point's launchers, or torchrun itself.
LAUNCH_MODES = ("torchrun", "spawn", "torchrun-command")


@dataclass(frozen=True)
class SubmitOptions:
    name: str
    namespace: str = "default"
    nnodes: int = 1
    nproc_per_node: int = 1
    device: str = "cpu"
    image: str = DEFAULT_IMAGE
    launch: str = "torchrun"
    script_args: Sequence[str] = ()
    mount_path: str = DEFAULT_MOUNT_PATH
    max_restarts: int | None = None
    env: Sequence[tuple[str, str]] = ()  # (name, value), in order
    cpu: str | None = None  # requests.cpu (no CPU limit: a limit throttles the training)
    memory: str | None = None  # requests and limits: the pod is not evicted for using what it asked
    local_rank_flag: str | None = None  # spec.localRankFlag: the launch-era flag the script reads
    requirements: str | None = None  # a file of the package: the pods pip install it first


#: ``parser.add_argument("--local_rank", ...)``: a script of the torch.distributed.launch era,
#: which needs the flag passed (spec.localRankFlag).
_LOCAL_RANK_ARGUMENT = re.compile(r"""add_argument\(\s*['"](--local[_-]rank)['"]""")


def local_rank_flag_of(source: str) -> str | None:
    """The local-rank flag a script's argparse defines (--local_rank or --local-rank), if any."""
    found = _LOCAL_RANK_ARGUMENT.search(source)
    return found.group(1) if found else None


def job_name_from(path: str) -> str:
    """A DDPJob name from a script or folder name: ``My_Train.py`` -> ``my-train``."""
    base = re.sub(r"\.py$", "", path.rstrip("/").split("/")[-1])
    name = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")
    name = re.sub(r"^[^a-z]+", "", name)[:spec.MAX_JOB_NAME_LENGTH].rstrip("-")
    return name or "job"


def configmap_name(job_name: str) -> str:
    return f"{job_name}-code"


def build_ddpjob(options: SubmitOptions, package: CodePackage) -> dict[str, Any]:
    """The DDPJob: the code volume at ``mount_path``, the entry script started as ``launch`` says."""
    script = f"{options.mount_path.rstrip('/')}/{package.entry}"
    body: dict[str, Any] = {"nnodes": options.nnodes, "nprocPerNode": options.nproc_per_node,
                            "device": options.device, "image": options.image}
    if options.launch == "torchrun-command":
        # Any image with torch: torchrun reads the job's rendezvous from PET_* (no init guard).
        body["command"] = ["torchrun", script]
        body["args"] = list(options.script_args)
    else:
        if options.launch == contract.LAUNCHER_SPAWN:
            body["launcher"] = contract.LAUNCHER_SPAWN
        before = ["--requirements", f"{options.mount_path.rstrip('/')}/{options.requirements}"] if options.requirements else []
        body["args"] = [*before, "--script", script, *options.script_args]
    body["volumeMounts"] = [{"name": CODE_VOLUME, "mountPath": options.mount_path, "readOnly": True}]
    body["template"] = {"spec": {"volumes": [build_volume(package, CODE_VOLUME, configmap_name(options.name))]}}
    if options.local_rank_flag and options.launch == contract.LAUNCHER_TORCHRUN:
        body["localRankFlag"] = options.local_rank_flag
    if options.env:
        body["env"] = [{"name": name, "value": value} for name, value in options.env]
    resources: dict[str, dict[str, str]] = {}
    if options.cpu is not None:
        resources.setdefault("requests", {})["cpu"] = options.cpu
    if options.memory is not None:
        resources.setdefault("requests", {})["memory"] = options.memory
        resources.setdefault("limits", {})["memory"] = options.memory
    if resources:
        body["resources"] = resources
    if options.max_restarts is not None:
        body["failurePolicy"] = {"maxRestarts": options.max_restarts}
    return {"apiVersion": names.GROUP_VERSION, "kind": names.KIND,
            "metadata": {"name": options.name, "namespace": options.namespace}, "spec": body}


def build_manifests(options: SubmitOptions, package: CodePackage) -> list[dict[str, Any]]:
    """ConfigMap first (the DDPJob's pods need it), then the DDPJob."""
    configmap = build_configmap(package, configmap_name(options.name), options.namespace,
                                {LABEL_SUBMITTED_CODE: options.name})
    return [configmap, build_ddpjob(options, package)]
