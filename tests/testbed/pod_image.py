"""What stands in for the trainer image's files on a test node, and which of it a pod's private
/tmp must show again.

There are no images here: a pod runs the agent's Python, with the pods' PYTHONPATH (the
checkout under test) and whatever the interpreter has installed (the project's editable
install among it). In a real image those files are never under /tmp; on a test node they may
be (a checkout cloned to /tmp/x, a virtual environment there), and then the private /tmp that
pod_init.py mounts over the host's would hide them: ``No module named 'ddptrainer'``. So the
agent lists, once at start, the host directories under /tmp that hold them, and pod_init.py
binds each back at the same path, read-only and not recursively: the pod sees those folders
as the host has them, cannot write to them, and sees nothing else of the host's /tmp (not
what is mounted inside them either). Everything else a pod writes under /tmp stays in its
tmpfs.

The list is the closed set below (the interpreter's prefixes and executable, its import path,
the pods' PYTHONPATH, the folders of editable installs), only existing directories, never /tmp
itself.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from typing import Iterable
from urllib.parse import unquote, urlparse


def unpullable(image: str) -> bool:
    """An image the test node cannot pull, as a kubelet could not: its registry is under the
    reserved ``.invalid`` domain (RFC 2606), which no resolver answers, kind's neither. Every
    other image stands for the trainer image's files (above)."""
    registry = image.split("/", 1)[0] if "/" in image else ""
    host = registry.rsplit(":", 1)[0].lower()
    return host == "invalid" or host.endswith(".invalid")


def image_paths_under_tmp(candidates: Iterable[str]) -> list[str]:
    """The absolute paths strictly under /tmp among ``candidates``, normalized and without
    duplicates, parents before children (a folder bound later on a child path stays visible).
    /tmp itself is never one: binding it would undo the private /tmp."""
    paths = set()
    for candidate in candidates:
        if not candidate or not os.path.isabs(candidate):
            continue
        path = os.path.normpath(candidate)
        if path.startswith("//"):  # normpath keeps a leading double slash
            path = "/" + path.lstrip("/")
        if path.startswith("/tmp/"):
            paths.add(path)
    return sorted(paths, key=lambda p: (p.count("/"), p))


def host_image_paths(pythonpath: str | None) -> list[str]:
    """The host directories under /tmp that a pod's processes need, for pod_init.py: see the
    module docstring. ``pythonpath``: the PYTHONPATH the pods get."""
    candidates = [*_interpreter_paths(), *(pythonpath or "").split(os.pathsep),
                  *_editable_project_dirs()]
    # A path outside /tmp may be a symlink into it (and the other way round): both count.
    candidates += [os.path.realpath(c) for c in candidates if c]
    return [p for p in image_paths_under_tmp(candidates) if os.path.isdir(p)]


def _interpreter_paths() -> list[str]:
    """The agent's Python, which the pods run: its prefixes (a virtual environment's and the
    base interpreter's), the folder of its executable, and its import path less the first
    entry (the agent's own start directory, which a pod's is not)."""
    return [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
            os.path.dirname(sys.executable), *sys.path[1:]]


def _editable_project_dirs() -> list[str]:
    """The project folders of editable installs (PEP 610's direct_url.json): their import
    hooks map packages into them, so they are on no import path."""
    folders = []
    for distribution in importlib.metadata.distributions():
        try:
            direct_url = json.loads(distribution.read_text("direct_url.json") or "{}")
        except (OSError, ValueError):
            continue
        url = urlparse(direct_url.get("url", ""))
        if direct_url.get("dir_info", {}).get("editable") and url.scheme == "file":
            folders.append(unquote(url.path))
    return folders
