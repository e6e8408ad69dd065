"""The last step before a pod's container command: what a container runtime does inside
the new namespaces. Runs as ``ip netns exec <netns> python -I -S pod_init.py <spec.json>``
(standard library only, so it starts in milliseconds), then execs the command, so the
command keeps this process's pid and the agent's SIGTERM reaches it directly.

`ip netns exec` has already given us a private mount namespace (mounts made here never
reach the host) with the pod's /etc/hosts and /etc/resolv.conf. Here: our own UTS namespace
with the pod's hostname, the volume bind mounts, a private /dev/shm, the working directory.

Any failure before the exec is a container start error: the message goes to the spec's
``start_error_file`` and we exit 128, as containerd reports a StartError.
"""
import ctypes
import json
import os
import socket
import sys

CLONE_NEWUTS = 0x04000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
START_ERROR_EXIT_CODE = 128

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def bind_mount(source: str, target: str, read_only: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC, None)
    if read_only:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)


def set_hostname(hostname: str) -> None:
    _check(_libc.unshare(CLONE_NEWUTS), "unshare(CLONE_NEWUTS)")
    socket.sethostname(hostname)


def prepare(spec: dict) -> None:
    set_hostname(spec["hostname"])
    # Parents before children, so a mount at /data/x is not hidden by one at /data.
    for mount in sorted(spec["mounts"], key=lambda m: m["target"].count("/")):
        bind_mount(mount["source"], mount["target"], mount.get("read_only", False))
    if spec.get("shm_size"):
        # A container runtime gives each container its own /dev/shm (64 MiB by default);
        # after the binds, so a Memory emptyDir under the host's /dev/shm is still visible.
        _mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['shm_size']}")
    os.chdir(spec["workdir"])


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    try:
        prepare(spec)
        argv = spec["argv"]
        if not argv:
            raise ValueError("the container has neither command nor args")
        os.execvpe(argv[0], argv, spec["env"])
    except Exception as error:  # noqa: BLE001 - every failure is reported the same way
        message = f"failed to start container: {error}"
        with open(spec["start_error_file"], "w") as handle:
            handle.write(message)
        print(message, file=sys.stderr)
        sys.exit(START_ERROR_EXIT_CODE)


if __name__ == "__main__":
    main()
