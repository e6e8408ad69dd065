"""A container's environment and argv with the kubelet's rules, for a pod and its status.

Supported: env ``value`` with ``$(VAR)`` expansion; ``valueFrom.fieldRef`` (metadata.name,
namespace, uid, labels['k'], annotations['k'], spec.nodeName, spec.serviceAccountName,
status.podIP(s), status.hostIP(s)); ``configMapKeyRef`` and ``secretKeyRef``; ``envFrom``.
``resourceFieldRef`` is refused with a clear message (nothing here enforces resources).
"""
from __future__ import annotations

import base64
import re
from typing import Callable

# fetch(kind, namespace, name) -> the object as a dict, or None if it does not exist.
Fetch = Callable[[str, str, str], "dict | None"]


class ConfigError(Exception):
    """The pod cannot start as written (CreateContainerConfigError on a real node)."""


class NotReadyYet(Exception):
    """Something the pod needs does not exist yet; the kubelet keeps retrying."""


_VAR_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names expand, unknown ones stay as written,
    ``$$`` is a literal ``$``."""

    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return variables.get(name, match.group(0))

    return _VAR_REFERENCE.sub(replace, text)


def field_value(pod: dict, field_path: str, pod_ip: str, host_ip: str) -> str:
    metadata, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": metadata["name"],
        "metadata.namespace": metadata["namespace"],
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if field_path in simple:
        return simple[field_path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    if match:
        return (metadata.get(match.group(1)) or {}).get(match.group(2), "")
    raise ConfigError(f"fieldRef {field_path!r} is not supported by the test node agent")


def _key_from(fetch: Fetch, kind: str, namespace: str, ref: dict) -> str | None:
    obj = fetch(kind, namespace, ref["name"])
    optional = ref.get("optional", False)
    if obj is None:
        if optional:
            return None
        raise NotReadyYet(f"{kind} {namespace}/{ref['name']} not found")
    value = _decoded_data(kind, obj).get(ref["key"])
    if value is None and not optional:
        raise ConfigError(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}")
    return value


def _decoded_data(kind: str, obj: dict) -> dict[str, str]:
    if kind == "secrets":
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    return dict(obj.get("data") or {})


def container_environment(
    pod: dict, container: dict, *, pod_ip: str, host_ip: str, base: dict[str, str],
    fetch: Fetch,
) -> dict[str, str]:
    """``base`` stands in for the image's environment (PATH and friends)."""
    namespace = pod["metadata"]["namespace"]
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
            if key in source:
                ref = source[key]
                obj = fetch(kind, namespace, ref["name"])
                if obj is None:
                    if ref.get("optional"):
                        continue
                    raise NotReadyYet(f"{kind} {namespace}/{ref['name']} not found")
                for name, value in _decoded_data(kind, obj).items():
                    env[prefix + name] = value
    for variable in container.get("env") or []:
        name = variable["name"]
        if "valueFrom" not in variable:
            env[name] = expand(variable.get("value", ""), env)
            continue
        source = variable["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip, host_ip)
        elif "configMapKeyRef" in source:
            value = _key_from(fetch, "configmaps", namespace, source["configMapKeyRef"])
            if value is not None:
                env[name] = value
        elif "secretKeyRef" in source:
            value = _key_from(fetch, "secrets", namespace, source["secretKeyRef"])
            if value is not None:
                env[name] = value
        else:
            raise ConfigError(
                f"env {name}: valueFrom {sorted(source)} is not supported by the test node agent"
            )
    return env


def container_argv(container: dict, env: dict[str, str]) -> list[str]:
    """command + args, both ``$(VAR)``-expanded. There are no images here, so no image
    ENTRYPOINT or CMD: with no command, args alone are the command line."""
    command = container.get("command") or []
    args = container.get("args") or []
    return [expand(part, env) for part in [*command, *args]]
