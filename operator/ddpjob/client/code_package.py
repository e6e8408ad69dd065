"""Your code as a ConfigMap: a script or a folder read from disk, checked, and built into the
ConfigMap and the volume that put it back together in every pod (``ddpjob submit``).

Reading is bounded (file count, total size) and refuses what a ConfigMap cannot carry, with the
way out named: more than 1 MiB, a file that is not UTF-8 text (data belongs in the image or a
volume; ``--exclude`` leaves such files out), a name a ConfigMap key cannot hold. ConfigMap keys
cannot contain ``/``, so a folder's ``pkg/util.py`` is stored under the key ``pkg__util.py`` and
the volume's ``items`` map each key back to its path.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: The API server refuses a ConfigMap whose keys and values together exceed this (the same
#: bound as a Secret's, in ``ValidateConfigMap``).
CONFIGMAP_MAX_BYTES = 1024 * 1024
#: Reading stops here, whatever the sizes: a folder of thousands of files is not "a script".
MAX_FILES = 500
#: Never packaged: version control, virtual environments, caches.
ALWAYS_EXCLUDED = (".*", "__pycache__", "*.pyc", "*.pyo", "venv", "node_modules")
KEY_SEPARATOR = "__"
_KEY_CHARACTERS = re.compile(r"^[-._a-zA-Z0-9]+$")
SIZE_ALTERNATIVES = ("leave files out with --exclude PATTERN, bake the code into an image (--image "
                     "YOUR_IMAGE and a DDPJob whose args name the script's path in it), or put it on "
                     "a shared volume (a PersistentVolumeClaim mounted with spec.volumeMounts)")


class PackageError(Exception):
    """The code cannot travel as a ConfigMap; the message says why and what to do instead."""


@dataclass(frozen=True)
class CodePackage:
    """The files to ship: path relative to the package root (``/``-separated) -> text."""

    files: Mapping[str, str]
    entry: str  # the script the pods run, one of ``files``

    def key(self, path: str) -> str:
        return path.replace("/", KEY_SEPARATOR)

    @property
    def size(self) -> int:
        """What the API server counts: every key and every value, in bytes."""
        return sum(len(self.key(p)) + len(text.encode()) for p, text in self.files.items())


def mib(size: int) -> str:
    return f"{size / (1024 * 1024):.2f} MiB"


def _excluded(relative: str, patterns: Sequence[str]) -> bool:
    parts = relative.split("/")
    return any(fnmatch.fnmatch(part, p) for part in parts for p in ALWAYS_EXCLUDED) or any(
        fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(parts[-1], p) for p in patterns)


def _walk(root: str, patterns: Sequence[str]) -> Iterable[str]:
    """Relative paths of the regular files under ``root``, sorted; symlinked folders are not
    followed (they could loop or leave the folder)."""
    for folder, subfolders, names in os.walk(root):
        relative_folder = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if relative_folder == "." else relative_folder + "/"
        subfolders[:] = sorted(d for d in subfolders if not _excluded(prefix + d, patterns))
        for name in sorted(names):
            relative = prefix + name
            if not _excluded(relative, patterns) and os.path.isfile(os.path.join(root, relative)):
                yield relative


def _read_text(path: str, relative: str, budget: int) -> str:
    with open(path, "rb") as file:
        raw = file.read(budget + 1)
    if len(raw) > budget:
        raise PackageError(f"{relative}: the code is more than a ConfigMap holds "
                           f"({mib(CONFIGMAP_MAX_BYTES)}); {SIZE_ALTERNATIVES}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PackageError(f"{relative}: not UTF-8 text; a ConfigMap of code carries text files "
                           f"only. Leave it out with --exclude {relative!r}, or ship data in the "
                           "image or on a volume") from None


def _default_entry(files: Mapping[str, str], root: str) -> str:
    for candidate in ("train.py", "main.py"):
        if candidate in files:
            return candidate
    top_level = [p for p in files if "/" not in p and p.endswith(".py")]
    if len(top_level) == 1:
        return top_level[0]
    raise PackageError(f"{root}: which script do the pods run? No train.py or main.py, and "
                       f"{len(top_level)} top-level .py files: name one with --entry FILE")


def read_package(path: str, *, entry: str | None = None, exclude: Sequence[str] = ()) -> CodePackage:
    """A script (the package is that one file) or a folder (every text file in it but the
    excluded), checked against what a ConfigMap can hold."""
    if os.path.isfile(path):
        if entry is not None:
            raise PackageError(f"--entry {entry}: only with a folder; {path} is a file (the script itself)")
        name = os.path.basename(path)
        package = CodePackage({name: _read_text(path, name, CONFIGMAP_MAX_BYTES)}, name)
    elif os.path.isdir(path):
        files: dict[str, str] = {}
        budget = CONFIGMAP_MAX_BYTES
        for relative in _walk(path, exclude):
            if len(files) == MAX_FILES:
                raise PackageError(f"{path}: more than {MAX_FILES} files; {SIZE_ALTERNATIVES}")
            files[relative] = _read_text(os.path.join(path, relative), relative, budget)
            budget -= len(files[relative].encode())
        if not files:
            raise PackageError(f"{path}: no files to package (all excluded, or an empty folder)")
        chosen = entry.strip("/").replace(os.sep, "/") if entry else _default_entry(files, path)
        if chosen not in files:
            raise PackageError(f"--entry {entry}: not a file of {path} (its files: "
                               f"{', '.join(sorted(files)[:10])}{', ...' if len(files) > 10 else ''})")
        package = CodePackage(files, chosen)
    else:
        raise PackageError(f"{path}: no such file or folder")
    check_package(package)
    return package


def check_package(package: CodePackage) -> None:
    """Names a ConfigMap key can hold, no two files on one key, within the size bound."""
    keys: dict[str, str] = {}
    for relative in package.files:
        key = package.key(relative)
        if not _KEY_CHARACTERS.match(key) or len(key) > 253:
            raise PackageError(f"{relative}: a ConfigMap key holds only letters, digits, '-', '_' and "
                               "'.' (at most 253), folders joined by '__'; rename it or --exclude it")
        if key in keys:
            raise PackageError(f"{relative} and {keys[key]} would share the ConfigMap key {key!r}; "
                               "rename one or --exclude it")
        keys[key] = relative
    if package.size > CONFIGMAP_MAX_BYTES:
        raise PackageError(f"the code is {mib(package.size)} ({len(package.files)} files), a ConfigMap "
                           f"holds at most {mib(CONFIGMAP_MAX_BYTES)} (keys and contents); {SIZE_ALTERNATIVES}")


def build_configmap(package: CodePackage, name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "data": {package.key(p): text for p, text in sorted(package.files.items())}}


def build_volume(package: CodePackage, volume_name: str, configmap_name: str) -> dict[str, Any]:
    """The pod volume that lays the files out as on disk: each key back at its path."""
    items = [{"key": package.key(p), "path": p} for p in sorted(package.files)]
    return {"name": volume_name, "configMap": {"name": configmap_name, "items": items}}
