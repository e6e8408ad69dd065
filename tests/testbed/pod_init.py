"""The last step before a pod's container command: what a container runtime does inside
the new namespaces. Runs as ``ip netns exec <netns> python -I -S pod_init.py <spec.json>``
(standard library only, so it starts in milliseconds), then execs the command, so the
command keeps this process's pid and the agent's SIGTERM reaches it directly.

`ip netns exec` has already given us a private mount namespace (mounts made here never
reach the host) with the pod's /etc/hosts and /etc/resolv.conf. Here: our own UTS namespace
with the pod's hostname, a private /tmp, the volume bind mounts, the pod's /dev/shm, the
working directory.

The private /tmp is what a container runtime gives every container: its image's /tmp in a
fresh writable layer, so two pods (or two runs of one container) never see each other's
files there. A tmpfs stands in for that layer. The host paths the agent hands us (volume
sources, the working directory, the start error file) may lie under the host's /tmp (the test
bed's state does); they are reached through a descriptor of the host's /tmp opened before
it is covered. So are the spec's ``image_paths``: what stands in for the image's own files
(the interpreter, the checkout under test) where it lies under the host's /tmp
(pod_image.py); they are bound back at their paths, read-only, before the volumes.

/dev/shm is the pod's, not the container's: containerd mounts one tmpfs per pod sandbox
(64 MiB by default) and binds it into every container of the pod, so it outlives a container
restart (pkg/cri's getSandboxDevShm). The agent mounts that tmpfs when it creates the pod's
network (mount_pod_shm) and removes it with the pod; here it is only bound.

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
MNT_DETACH = 0x2
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


def bind_mount(source: str, target: str, read_only: bool, recursive: bool = True) -> None:
    _mount(source, target, None, MS_BIND | (MS_REC if recursive else 0), None)
    if read_only:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)


class HostTmp:
    """The host's /tmp, still reachable after a private one covers it."""

    def __init__(self) -> None:
        self.fd = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)

    def path(self, host_path: str) -> str:
        """The same file as ``host_path`` on the host, also once /tmp is covered."""
        if host_path == "/tmp" or host_path.startswith("/tmp/"):
            return f"/proc/self/fd/{self.fd}{host_path[len('/tmp'):]}"
        return host_path


def mount_pod_shm(path: str, size: str) -> None:
    """The pod sandbox's /dev/shm: a tmpfs of ``size`` at ``path`` (on the host)."""
    os.makedirs(path, exist_ok=True)
    _mount("shm", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={size}")


def unmount(path: str) -> None:
    """Lazily, so a process still inside cannot keep the pod's memory (EINVAL: not mounted)."""
    if _libc.umount2(path.encode(), MNT_DETACH) != 0 and ctypes.get_errno() != 22:
        errno = ctypes.get_errno()
        raise OSError(errno, f"umount {path}: {os.strerror(errno)}")


def is_under_tmp(path: str) -> bool:
    return path == "/tmp" or path.startswith("/tmp/")


def make_target(target: str, like: str) -> None:
    """A mountpoint inside the private /tmp (the agent made the host's, which is covered)."""
    if os.path.isdir(like):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()


def set_hostname(hostname: str) -> None:
    _check(_libc.unshare(CLONE_NEWUTS), "unshare(CLONE_NEWUTS)")
    socket.sethostname(hostname)


def prepare(spec: dict, host: HostTmp) -> None:
    set_hostname(spec["hostname"])
    if spec.get("tmp_size"):
        # Resolved while the host's /tmp is still in view: a symlink there may be absolute.
        image_sources = [(path, host.path(os.path.realpath(path)))
                         for path in spec.get("image_paths", [])]  # parents first (pod_image.py)
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={spec['tmp_size']}")
        # Not recursive: what is mounted inside them on the host (another pod's /dev/shm,
        # should the test bed's state lie there) stays out of this pod.
        for path, source in image_sources:
            make_target(path, source)
            bind_mount(source, path, read_only=True, recursive=False)
    # Parents before children, so a mount at /data/x is not hidden by one at /data.
    for mount in sorted(spec["mounts"], key=lambda m: m["target"].count("/")):
        source = host.path(mount["source"])
        if spec.get("tmp_size") and is_under_tmp(mount["target"]):
            make_target(mount["target"], source)
        bind_mount(source, mount["target"], mount.get("read_only", False))
    if spec.get("pod_shm"):
        # After the binds, so a Memory emptyDir under the host's /dev/shm is still visible.
        bind_mount(host.path(spec["pod_shm"]), "/dev/shm", False)
    workdir = spec["workdir"]
    if spec.get("tmp_size") and is_under_tmp(workdir):
        if spec.get("workdir_is_the_agents"):  # the per-pod stand-in for the image's WORKDIR
            # Bound even where a read-only image path already shows it: it is the pod's to write.
            make_target(workdir, host.path(workdir))
            bind_mount(host.path(workdir), workdir, False)
        elif not os.path.isdir(workdir):  # a workingDir the image would have had
            os.makedirs(workdir)
    os.chdir(workdir)


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    host = HostTmp()
    try:
        prepare(spec, host)
        argv = spec["argv"]
        if not argv:
            raise ValueError("the container has neither command nor args")
        os.execvpe(argv[0], argv, spec["env"])
    except Exception as error:  # noqa: BLE001 - every failure is reported the same way
        message = f"failed to start container: {error}"
        with open(host.path(spec["start_error_file"]), "w") as handle:
            handle.write(message)
        print(message, file=sys.stderr)
        sys.exit(START_ERROR_EXIT_CODE)


if __name__ == "__main__":
    main()
