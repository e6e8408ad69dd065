"""Volumes under `ddpjob run`: each volume mount becomes a directory on this machine.

Local processes cannot mount anything, so `ddpjob run` gives every ``spec.volumeMounts`` entry
a local directory and rewrites its mountPath wherever it appears in the command, args and env
values (``/workspace/train.py`` -> ``/tmp/ddpjob-run-x/scripts/train.py``):

* ``hostPath``: the host path itself (the nodes run on this host);
* ``configMap`` naming a ConfigMap defined in the same file: its data written to files, so the
  portable way to ship a small script with a job (a ConfigMap next to the DDPJob, mounted at
  /workspace) runs unchanged locally;
* anything else (emptyDir, persistentVolumeClaim, secret, a ConfigMap not in the file): an empty
  scratch directory that the nodes share for the whole run, with a note saying so.

A program that uses a mount path without it appearing in its command, args or env (a default
baked into the program) still sees the real path: that is the limit of rewriting, documented in
docs/local-run.md.
"""
from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class LocalMount:
    mount_path: str  # as in the pod, without a trailing slash
    local_path: str
    note: str  # one line that tells the user what became of the volume


def _volume_kind(volume: Mapping[str, Any]) -> str:
    kinds = [k for k in volume if k != "name"]
    return kinds[0] if kinds else "unknown"


def _write_configmap(configmap: Mapping[str, Any], items: Sequence[Mapping[str, Any]],
                     directory: str) -> None:
    """Write a ConfigMap's keys as files, as the kubelet does (``items`` picks and renames)."""
    files: dict[str, bytes] = {k: str(v).encode() for k, v in (configmap.get("data") or {}).items()}
    files.update({k: base64.b64decode(v) for k, v in (configmap.get("binaryData") or {}).items()})
    wanted = [(i["key"], i.get("path", i["key"])) for i in items] if items else [(k, k) for k in files]
    for key, relative in wanted:
        if key not in files:
            raise ValueError(f"ConfigMap {configmap['metadata']['name']!r} has no key {key!r}")
        path = os.path.join(directory, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(files[key])


def materialise_mounts(volume_mounts: Sequence[Mapping[str, Any]], volumes: Sequence[Mapping[str, Any]],
                       configmaps: Mapping[str, Mapping[str, Any]], scratch_dir: str) -> list[LocalMount]:
    """Give every volume mount a local directory (creating scratch ones under ``scratch_dir``)."""
    by_name = {v["name"]: v for v in volumes}
    prepared: dict[str, tuple[str, str]] = {}  # volume name -> (local dir, note)
    mounts = []
    for mount in volume_mounts:
        name = mount["name"]
        volume = by_name.get(name, {"name": name})
        if name not in prepared:
            prepared[name] = _prepare_volume(volume, configmaps, scratch_dir)
        local_dir, note = prepared[name]
        local_path = os.path.join(local_dir, mount["subPath"]) if mount.get("subPath") else local_dir
        mount_path = mount["mountPath"].rstrip("/") or "/"
        mounts.append(LocalMount(mount_path, local_path, f"{mount_path} -> {local_path}: {note}"))
    return mounts


def _prepare_volume(volume: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, Any]],
                    scratch_dir: str) -> tuple[str, str]:
    kind = _volume_kind(volume)
    name = volume["name"]
    if kind == "hostPath":
        return volume["hostPath"]["path"], f"hostPath volume {name!r} is this machine's directory"
    directory = os.path.join(scratch_dir, "volumes", name)
    os.makedirs(directory, exist_ok=True)
    if kind == "configMap" and volume["configMap"].get("name") in configmaps:
        source = volume["configMap"]
        _write_configmap(configmaps[source["name"]], source.get("items") or (), directory)
        return directory, f"configMap volume {name!r} written from ConfigMap {source['name']!r} in the file"
    if kind == "emptyDir":
        return directory, f"emptyDir volume {name!r} is a scratch directory shared by the nodes"
    return directory, (f"{kind} volume {name!r} needs a cluster: locally it is an empty scratch "
                       "directory shared by the nodes")


def rewrite_mount_paths(text: str, mounts: Sequence[LocalMount]) -> str:
    """Replace each mount path that appears as a whole path in ``text``, in one pass.

    ``/workspace`` matches in ``/workspace/a.py``, ``--dir=/workspace`` and ``a:/workspace``,
    but not in ``/workspace2`` or ``/x/workspace``. Longer mount paths are tried first, so a
    mount nested in another wins; one pass, so a replacement is never rewritten again.
    """
    local_path = {m.mount_path: m.local_path for m in mounts if m.mount_path != "/"}
    if not local_path:
        return text
    alternatives = "|".join(re.escape(p) for p in sorted(local_path, key=len, reverse=True))
    pattern = r"(?<![\w./-])(" + alternatives + r")(?![\w.-])"
    return re.sub(pattern, lambda match: local_path[match.group(1)], text)
