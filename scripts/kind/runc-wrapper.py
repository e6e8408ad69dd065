#!/usr/bin/python3
"""runc, minus CAP_SYS_RESOURCE: the Docker runtime of the project's private dockerd.

On some VMs (this project's CI machines among them) every process but PID 1 lacks
CAP_SYS_RESOURCE in its capability bounding set, and Docker asks runc for the full set for a
`--privileged` container (kind always starts its nodes privileged): runc then fails with
"unable to apply caps: operation not permitted". This wrapper removes that one capability from
the container's config (the bundle's config.json for create/run, the --process file for exec)
when the running process cannot grant it, then runs the real runc with the same arguments.
"""
import json
import os
import sys

REAL_RUNC = os.environ.get("DDPJOB_REAL_RUNC", "/usr/sbin/runc")
CAP = "CAP_SYS_RESOURCE"
CAP_SYS_RESOURCE_BIT = 24


def bounding_set_has_cap() -> bool:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapBnd:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE_BIT & 1)
    return True


def option(args: list, *names: str):
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def strip_cap(path: str, key: str | None) -> None:
    try:
        with open(path) as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return
    process = config.get(key) if key else config
    caps = (process or {}).get("capabilities") or {}
    changed = False
    for kind, values in caps.items():
        if isinstance(values, list) and CAP in values:
            caps[kind] = [v for v in values if v != CAP]
            changed = True
    if changed:
        with open(path + ".tmp", "w") as handle:
            json.dump(config, handle)
        os.replace(path + ".tmp", path)


def main() -> None:
    args = sys.argv[1:]
    if not bounding_set_has_cap():
        commands = [a for a in args if not a.startswith("-")]
        if "exec" in args:
            process = option(args, "--process", "-p")
            if process:
                strip_cap(process, None)
        elif any(c in ("create", "run") for c in commands):
            bundle = option(args, "--bundle", "-b") or "."
            strip_cap(os.path.join(bundle, "config.json"), "process")
    os.execv(REAL_RUNC, [REAL_RUNC, *args])


if __name__ == "__main__":
    main()
