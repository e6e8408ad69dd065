"""A pod's volumes as host directories, and the bind mounts that put them at the container's
mountPaths (made by pod_init.py inside the pod's private mount namespace).

Supported: emptyDir (medium Memory on tmpfs), hostPath, configMap, secret, downwardAPI and
projected (configMap/secret/downwardAPI sources). The ServiceAccount token volume the API
server injects (``kube-api-access-*``) is not mounted: pods cannot reach the API server
here, it listens on the host's 127.0.0.1. Anything else is a clear start error.

ConfigMap and Secret contents are written once at start; later edits do not propagate.
"""
from __future__ import annotations

import base64
import threading
from pathlib import Path

from .pod_env import ConfigError, Fetch, NotReadyYet, field_value

MEMORY_VOLUMES_ROOT = Path("/dev/shm/ddpjob-testbed-volumes")
SKIPPED_PREFIX = "kube-api-access-"
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"


class MountpointRegistry:
    """Paths created on the host only to serve as mount targets (a container runtime would
    create them in the image's root filesystem). Recorded in a file so they are removed at
    the agent's exit, or at the next start after a crash."""

    def __init__(self, record: Path):
        self.record = record
        self._lock = threading.Lock()

    def ensure(self, target: str, is_dir: bool) -> None:
        path = Path(target)
        if path.exists():
            return
        with self._lock:
            missing = [p for p in [*reversed(path.parents), path] if not p.exists()]
            for p in missing:
                if p != path or is_dir:
                    p.mkdir(exist_ok=True)
                else:
                    p.touch()
                with open(self.record, "a") as handle:
                    handle.write(f"{p}\n")

    def remove_all(self) -> None:
        """Deepest first; only what is still empty (never a file someone wrote to)."""
        with self._lock:
            try:
                paths = self.record.read_text().split()
            except FileNotFoundError:
                return
            for raw in sorted(set(paths), key=lambda p: p.count("/"), reverse=True):
                p = Path(raw)
                try:
                    if p.is_dir() and not p.is_symlink():
                        p.rmdir()
                    elif p.is_file() and p.stat().st_size == 0:
                        p.unlink()
                except OSError:
                    pass  # still in use or not empty: leave it
            self.record.unlink(missing_ok=True)


def _write_files(directory: Path, files: dict[str, bytes], mode: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)


def _object_files(kind: str, obj: dict, source: dict, volume_name: str) -> dict[str, bytes]:
    """The files of a configMap or secret volume (or projected source)."""
    data: dict[str, bytes] = {}
    if kind == "secrets":
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    else:
        data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    items = source.get("items")
    if not items:
        return data
    files = {}
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise ConfigError(f"volume {volume_name}: key {item['key']} not found")
        files[item["path"]] = data[item["key"]]
    return files


def _fetch_source(fetch: Fetch, kind: str, namespace: str, source: dict) -> dict | None:
    name = source.get("name") or source.get("secretName")
    obj = fetch(kind, namespace, name)
    if obj is None and not source.get("optional"):
        raise NotReadyYet(f"{kind} {namespace}/{name} not found (volume waits, as a kubelet)")
    return obj


def _downward_files(pod: dict, items: list, pod_ip: str, host_ip: str) -> dict[str, bytes]:
    files = {}
    for item in items or []:
        if "fieldRef" not in item:
            raise ConfigError(f"downwardAPI item {item.get('path')}: only fieldRef is supported")
        value = field_value(pod, item["fieldRef"]["fieldPath"], pod_ip, host_ip)
        files[item["path"]] = value.encode()
    return files


def prepare_volume(
    volume: dict, pod: dict, pod_dir: Path, fetch: Fetch, pod_ip: str, host_ip: str
) -> Path | None:
    """Create the host directory behind one volume; None for a volume that is not mounted."""
    name = volume["name"]
    namespace = pod["metadata"]["namespace"]
    uid = pod["metadata"]["uid"]
    directory = pod_dir / "volumes" / name
    if "emptyDir" in volume:
        if (volume["emptyDir"] or {}).get("medium") == "Memory":
            directory = MEMORY_VOLUMES_ROOT / uid / name
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)
        return directory
    if "hostPath" in volume:
        path = Path(volume["hostPath"]["path"])
        kind = volume["hostPath"].get("type") or ""
        if kind == "DirectoryOrCreate":
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)
        elif not path.exists():
            raise NotReadyYet(f"hostPath {path} does not exist (type {kind or 'unset'})")
        return path
    if "configMap" in volume or "secret" in volume:
        kind, source = ("configmaps", volume["configMap"]) if "configMap" in volume else (
            "secrets", volume["secret"])
        obj = _fetch_source(fetch, kind, namespace, source)
        files = _object_files(kind, obj, source, name) if obj else {}
        _write_files(directory, files, source.get("defaultMode", 0o644))
        return directory
    if "downwardAPI" in volume:
        source = volume["downwardAPI"]
        files = _downward_files(pod, source.get("items"), pod_ip, host_ip)
        _write_files(directory, files, source.get("defaultMode", 0o644))
        return directory
    if "projected" in volume:
        if name.startswith(SKIPPED_PREFIX):
            return None
        files: dict[str, bytes] = {}
        for source in volume["projected"].get("sources") or []:
            if "configMap" in source or "secret" in source:
                kind, ref = ("configmaps", source["configMap"]) if "configMap" in source else (
                    "secrets", source["secret"])
                obj = _fetch_source(fetch, kind, namespace, ref)
                if obj:
                    files.update(_object_files(kind, obj, ref, name))
            elif "downwardAPI" in source:
                files.update(_downward_files(pod, source["downwardAPI"].get("items"),
                                             pod_ip, host_ip))
            else:
                raise ConfigError(
                    f"volume {name}: projected source {sorted(source)} is not supported "
                    "by the test node agent")
        _write_files(directory, files, volume["projected"].get("defaultMode", 0o644))
        return directory
    kinds = sorted(k for k in volume if k != "name")
    raise ConfigError(f"volume {name}: type {kinds} is not supported by the test node agent")


_READ_ONLY_KINDS = ("configMap", "secret", "downwardAPI", "projected")


def container_mounts(
    pod: dict, container: dict, pod_dir: Path, fetch: Fetch, pod_ip: str, host_ip: str,
    registry: MountpointRegistry,
) -> tuple[list[dict], Path]:
    """The bind mounts for pod_init.py, and the host file behind terminationMessagePath."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    prepared: dict[str, Path | None] = {}
    mounts = []
    for volume_mount in container.get("volumeMounts") or []:
        name = volume_mount["name"]
        if name not in volumes:
            raise ConfigError(f"volumeMount {name}: no such volume")
        if name not in prepared:
            prepared[name] = prepare_volume(volumes[name], pod, pod_dir, fetch, pod_ip, host_ip)
        source = prepared[name]
        if source is None:
            continue
        if volume_mount.get("subPath"):
            source = source / volume_mount["subPath"]
            if not source.exists():
                source.mkdir(parents=True)
        target = volume_mount["mountPath"]
        registry.ensure(target, is_dir=source.is_dir())
        read_only = volume_mount.get("readOnly", False) or any(
            k in volumes[name] for k in _READ_ONLY_KINDS)
        mounts.append({"source": str(source), "target": target, "read_only": read_only})
    termination_log = pod_dir / "termination-log"
    termination_log.write_bytes(b"")  # each container run starts with an empty message
    termination_log.chmod(0o666)
    target = container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
    registry.ensure(target, is_dir=False)
    mounts.append({"source": str(termination_log), "target": target, "read_only": False})
    return mounts, termination_log


def working_directory(container: dict, default: Path, registry: MountpointRegistry) -> str:
    """The container's workingDir (created like a mountpoint if the host lacks it); without
    one, a private per-pod directory stands in for the image's WORKDIR."""
    workdir = container.get("workingDir")
    if not workdir:
        default.mkdir(parents=True, exist_ok=True)
        return str(default)
    registry.ensure(workdir, is_dir=True)
    return workdir


def memory_volumes_of(uid: str) -> Path:
    return MEMORY_VOLUMES_ROOT / uid

