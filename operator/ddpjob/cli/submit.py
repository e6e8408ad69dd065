"""`ddpjob submit PATH`: run your script (or folder) on the cluster as a DDPJob, no image to build.

Your code travels as a ConfigMap, mounted read-only in every pod (at /workspace/code), and the
DDPJob runs the entry script in the image (default: the trainer image, which has torch and the
pod entry point). `--dry-run` prints the ConfigMap and the DDPJob as YAML instead, to commit
or to try with `ddpjob run -f`. A ConfigMap holds at most 1 MiB of text: for more, or for data,
bake an image or use a shared volume.

What travels from a folder: its regular files, less dotfiles (.env, .git/), caches, what its
.gitignore and then its .ddpjobignore leave out (gitignore patterns, the last match decides:
!PATTERN in .ddpjobignore brings back what .gitignore leaves out) and what --exclude names
(always left out). A link that leads out of the folder, to a file left out, or to anything but
a regular file is refused, and so is a private key; files that look like secrets (*.pem,
*.key, *.env, credentials*) are named on stderr before anything is created.
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import Any, Optional, TextIO

import yaml

from ddpjob import contract
from ddpjob.api.validation import validate_ddpjob
from ddpjob.client.code_package import PackageError, read_package
from ddpjob.client.job_table import RESOURCE
from ddpjob.client.submission import (DEFAULT_IMAGE, DEFAULT_MOUNT_PATH, LABEL_SUBMITTED_CODE, LAUNCH_MODES,
                                      SubmitOptions, build_manifests, job_name_from, local_rank_flag_of)
from ddpjob.client.user_defaults import CONFIG_ENV, IMAGE_ENV, default_image

EXIT_OK = 0
EXIT_FAILED = 1  # the cluster refused or could not be reached
EXIT_INVALID = 2  # bad flags or code that cannot travel as a ConfigMap

# A problem on a spec field is reported with the flag that set it.
FLAG_OF_FIELD = {"metadata.name": "--name", "metadata.namespace": "--namespace", "spec.nnodes": "--nnodes",
                 "spec.nprocPerNode": "--nproc-per-node", "spec.device": "--device", "spec.image": "--image",
                 "spec.volumeMounts": "--mount-path", "spec.failurePolicy.maxRestarts": "--max-restarts",
                 "spec.env": "--env", "spec.resources.requests.cpu": "--cpu",
                 "spec.resources.requests.memory": "--memory", "spec.resources.limits.memory": "--memory",
                 "spec.localRankFlag": "--local-rank-flag"}
#: --local-rank-flag and --requirements: "not even the one the code has".
NONE = "none"
#: A folder's packages to install, found without a flag (--requirements none: not installed).
REQUIREMENTS_FILE = "requirements.txt"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "submit", usage="ddpjob submit [OPTIONS] PATH [-- ARGS...]  (ARGS: your script's own arguments)", help="run a local script or folder on the cluster as a DDPJob (--dry-run: print the YAML)",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  ddpjob submit train.py --nnodes 2 --nproc-per-node 2 -- --epochs 3\n"
        "  ddpjob submit ./project --entry train.py --nnodes 4 --device gpu --nproc-per-node 8 --image my/img:1\n"
        "  ddpjob submit ./project --nnodes 2 --dry-run > job.yaml && ddpjob run -f job.yaml\n"
        "  ddpjob submit train.py --nnodes 2 --follow   # its logs, then its result as the exit code\n"
        "Exit 0 when the job was created (or printed), 2 for bad flags or code that cannot be\n"
        "shipped, 1 when the cluster refused it; with --follow, then the job's result: 0\n"
        "Succeeded, 1 Failed, 3 it could no longer be read. See docs/submit.md.")
    parser.add_argument("path", metavar="PATH", help="your script, or a folder of code (every text file in it)")
    parser.add_argument("--nnodes", type=int, default=1, metavar="N", help="pods (nodes) (default: %(default)s)")
    parser.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                        help="training processes per pod; with --device gpu, GPUs per pod (default: 1)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default=None, help="cpu (gloo) or gpu (NCCL) (default: cpu)")
    parser.add_argument("--image", default=None,
                        help="image of the pods: it needs Python, torch and what your code imports "
                        f"(default: ${IMAGE_ENV}, else image: in ~/.config/ddpjob/config.yaml or "
                        f"${CONFIG_ENV}, else the trainer image {DEFAULT_IMAGE}, which a real cluster "
                        "pulls only once it is pushed: make push REGISTRY=...)")
    parser.add_argument("--name", help="the DDPJob's name (default: from PATH, e.g. train.py -> train)")
    parser.add_argument("-n", "--namespace", default="default", help="namespace (default: %(default)s)")
    parser.add_argument("--entry", metavar="FILE",
                        help="with a folder: the script to run, relative to it (default: train.py, "
                        "main.py, or the only top-level .py file)")
    parser.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                        help="leave out files matching this glob (repeatable), whatever .gitignore and "
                        ".ddpjobignore say (.* files and folders, __pycache__ and *.pyc are always "
                        "left out; --exclude .gitignore: its patterns are not read)")
    parser.add_argument("--launcher", choices=LAUNCH_MODES, default="torchrun",
                        help="torchrun (default): the image's pod entry point starts nproc-per-node "
                        "copies of the script, with the init guard; spawn: it starts the script once "
                        "and the script spawns its processes (mp.spawn); torchrun-command: plain "
                        "`torchrun SCRIPT` as the command, for an image with torch but without ddpjob")
    parser.add_argument("--gpus", type=int, metavar="N",
                        help="GPUs per pod: --device gpu --nproc-per-node N (one process per GPU)")
    parser.add_argument("--cpu", metavar="QUANTITY",
                        help="CPUs each pod requests, e.g. 4 or 500m (no CPU limit: it would throttle training)")
    parser.add_argument("--memory", metavar="QUANTITY",
                        help="memory each pod requests and may use, e.g. 16Gi (request = limit)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the training processes (repeatable); for a "
                        "secret, use spec.env valueFrom in a manifest (--dry-run), not a value here")
    parser.add_argument("--local-rank-flag", choices=(*contract.LOCAL_RANK_FLAGS, NONE),
                        help="pass --local_rank=N (or --local-rank=N) to each process, as "
                        "torch.distributed.launch did (default: the one the entry script's argparse "
                        "defines, if any; none: never)")
    parser.add_argument("--requirements", metavar="FILE",
                        help="with a folder: its file of packages to pip install in each pod before the "
                        f"first attempt (default: {REQUIREMENTS_FILE} if the folder has one; none: never)")
    parser.add_argument("--mount-path", default=DEFAULT_MOUNT_PATH, metavar="DIR",
                        help="where the code appears in the pods (default: %(default)s)")
    parser.add_argument("--max-restarts", type=int, metavar="N",
                        help="gang restarts allowed after retryable failures (default: the DDPJob's, 3)")
    parser.add_argument("--follow", action="store_true",
                        help="then print every node's log until the job ends, and exit with its result "
                        "(0 Succeeded, 1 Failed, 3 it cannot be read; Ctrl-C leaves it running: 130)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the ConfigMap and the DDPJob as YAML, create nothing")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    # Everything after `--` is the script's (main.py hands it over: argparse would read it).
    parser.set_defaults(handler=run_submit, script_args=())
    return parser


def manifests_from_args(args: argparse.Namespace, err: Optional[TextIO] = None) -> list[dict]:
    """The ConfigMap and the DDPJob the flags describe; PackageError or ValueError (one line each).
    What the code's reading warns of (files that look like secrets) goes to ``err`` first."""
    image = args.image or default_image()[0]
    package = read_package(args.path, entry=args.entry, exclude=args.exclude)
    for line in package.warnings:
        print(f"ddpjob submit: warning: {line}", file=err or sys.stderr)
    device, nproc_per_node = _device_and_processes(args)
    env = tuple(_env_pair(item) for item in args.env)
    flag = _local_rank_flag(args, package, err or sys.stderr)
    requirements = _requirements(args, package, err or sys.stderr)
    options = SubmitOptions(
        name=args.name or job_name_from(args.path), namespace=args.namespace, nnodes=args.nnodes,
        nproc_per_node=nproc_per_node, device=device, image=image, launch=args.launcher,
        script_args=tuple(args.script_args), mount_path=args.mount_path, max_restarts=args.max_restarts,
        env=env, cpu=args.cpu, memory=args.memory, local_rank_flag=flag, requirements=requirements)
    manifests = build_manifests(options, package)
    problems = validate_ddpjob(manifests[-1])
    if problems:
        raise ValueError("\n".join(_in_flag_terms(str(p.path), p.message) for p in problems))
    return manifests


def _device_and_processes(args: argparse.Namespace) -> tuple[str, int]:
    """--gpus N is --device gpu --nproc-per-node N; a flag that says otherwise is an error."""
    if args.gpus is None:
        return args.device or "cpu", 1 if args.nproc_per_node is None else args.nproc_per_node
    if args.gpus < 1:
        raise ValueError(f"--gpus {args.gpus}: must be at least 1 (for CPU training, leave --gpus out)")
    if args.device == "cpu":
        raise ValueError(f"--gpus {args.gpus} and --device cpu disagree: leave one out")
    if args.nproc_per_node is not None and args.nproc_per_node != args.gpus:
        raise ValueError(f"--gpus {args.gpus} and --nproc-per-node {args.nproc_per_node} disagree: one "
                         "process per GPU, so give one of them")
    return "gpu", args.gpus


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def _env_pair(item: str) -> tuple[str, str]:
    name, equals, value = item.partition("=")
    if not equals or not _ENV_NAME.fullmatch(name):
        raise ValueError(f"--env {item!r}: expected NAME=VALUE (a name of letters, digits, _, . and -, "
                         "not starting with a digit)")
    return name, value


def _local_rank_flag(args: argparse.Namespace, package: Any, err: TextIO) -> Optional[str]:
    """The flag given, else the one the entry script defines (said on ``err``), else none. A
    launch-era script run without it stops at its argparse ("the following arguments are
    required: --local_rank") on every rank."""
    if args.local_rank_flag == NONE:
        return None
    if args.local_rank_flag:
        return args.local_rank_flag
    found = local_rank_flag_of(package.files.get(package.entry, ""))
    if found is None:
        return None
    if args.launcher != "torchrun":
        raise ValueError(f"{package.entry} defines {found} (torch.distributed.launch style), which only "
                         "--launcher torchrun passes; use it, or --local-rank-flag none if the script "
                         "does not need the flag")
    print(f"ddpjob submit: {package.entry} defines {found}: each process gets {found}=N, as "
          f"torch.distributed.launch passed it (spec.localRankFlag; --local-rank-flag none: not)", file=err)
    return found


def _requirements(args: argparse.Namespace, package: Any, err: TextIO) -> Optional[str]:
    """The package's requirements file the pods install first: --requirements FILE, else the
    folder's requirements.txt (said on ``err``), else none."""
    given = args.requirements
    if given == NONE:
        return None
    name = given or REQUIREMENTS_FILE
    if name not in package.files:
        if given:
            raise ValueError(f"--requirements {given}: not a file of the code that is shipped (a path "
                             "relative to the folder; a single script ships alone: put it in a folder "
                             "with its requirements)")
        return None
    if args.launcher == "torchrun-command":
        raise ValueError(f"{name}: --launcher torchrun-command has no pod entry point to install it; use "
                         "--launcher torchrun, an image that has the packages, or --requirements none")
    if not given:
        print(f"ddpjob submit: {name}: each pod pip installs it before the first attempt (it needs a "
              "package index the pods can reach; --requirements none: not)", file=err)
    return name


class _CodeDumper(yaml.SafeDumper):
    """Multi-line strings (the code) as YAML literal blocks, readable in a diff."""


_CodeDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def manifests_yaml(manifests: list[dict]) -> str:
    return yaml.dump_all(manifests, Dumper=_CodeDumper, sort_keys=False, default_flow_style=False,
                         explicit_start=True, allow_unicode=True)


def _in_flag_terms(path: str, message: str) -> str:
    for field, flag in FLAG_OF_FIELD.items():
        if path == field or path.startswith((field + ".", field + "[")):
            return f"{flag} ({path}): {message}"
    return f"{path}: {message}"


def run_submit(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        manifests = manifests_from_args(args, err)
    except (PackageError, ValueError) as error:
        for line in str(error).splitlines():
            print(f"ddpjob submit: error: {line}", file=err)
        return EXIT_INVALID
    configmap, job = manifests
    if args.dry_run:
        out.write(manifests_yaml(manifests))
        return EXIT_OK
    from ddpjob.client import cluster

    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    try:
        conn = cluster.connect(args.kubeconfig, args.context)
        existing = cluster.get_job(conn, namespace, name)
        if existing is not None:
            phase = (existing.get("status") or {}).get("phase") or "no phase yet"
            raise cluster.ClusterError(f"DDPJob {namespace}/{name} exists ({phase}): delete it "
                                       f"(kubectl delete ddpjob {name} -n {namespace}) or choose another --name")
        cluster.put_configmap(conn, configmap, owned_if=(LABEL_SUBMITTED_CODE, name))
        created = cluster.create_job(conn, job)
        cluster.own_configmap(conn, configmap, created)
    except cluster.ClusterError as error:
        print(f"ddpjob submit: error: {error}", file=err)
        return EXIT_FAILED
    files = len(configmap["data"])
    if args.follow:
        print(f"ddpjob submit: created DDPJob {namespace}/{name} ({files} file{'s' * (files != 1)}); "
              "following it (Ctrl-C leaves it running)", file=err)
        print(f"{RESOURCE}/{name}", file=out)
        from ddpjob.cli.follow import follow

        return follow(conn, args, name, out, err)
    print(f"ddpjob submit: created ConfigMap {namespace}/{configmap['metadata']['name']} ({files} "
          f"file{'s' * (files != 1)}) and DDPJob {namespace}/{name}", file=err)
    print(f"  watch it:   kubectl get ddpjob {name} -n {namespace} -w", file=err)
    print(f"  its status: ddpjob status {name} -n {namespace}", file=err)
    print(f"  its logs:   ddpjob logs {name} -n {namespace} -f", file=err)
    print(f"{RESOURCE}/{name}", file=out)  # kubectl's "resource.group/name" line, for scripts
    return EXIT_OK
