"""One worker, started through the pod's warm process (ddptrainer/warm_start.py).

Run by torchrun as ``python -S warm_start_client.py <socket> -- <what follows python>``: standard
library only and no site (it starts in milliseconds). It hands its argv, environment, working
folder and standard streams to the warm process, which forks the worker; then it stands in for
the worker: the signals it gets go to the worker, and it ends as the worker ended (its exit code,
or the signal that killed it). If the warm process cannot be reached, it becomes the worker the
usual way: ``exec python -u <what follows python>``.
"""
import json
import os
import signal
import socket
import struct
import sys

_HEADER = struct.Struct("!I")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
CONNECT_SECONDS = 5.0


def _fallback(worker_argv, why):
    sys.stderr.write(f"ddptrain-pod: warm start: {why}; starting the worker as usual\n")
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-u", *worker_argv])


def _read_line(conn):
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > 65536:
            return None
    try:
        return json.loads(bytes(data))
    except ValueError:
        return None


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: python -S warm_start_client.py <socket> -- <script or -m module> [args]\n")
        return 2
    path, worker_argv = argv[1], argv[3:]
    body = json.dumps({"argv": worker_argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_SECONDS)
        conn.connect(path)
        message = _HEADER.pack(len(body)) + body
        sent = socket.send_fds(conn, [message[:65536]], [0, 1, 2])
        conn.sendall(message[sent:])
        answer = _read_line(conn)
    except OSError as error:
        conn.close()
        _fallback(worker_argv, f"no warm process at {path} ({error})")
        return 1  # not reached: exec
    if not isinstance(answer, dict) or not isinstance(answer.get("pid"), int):
        conn.close()
        _fallback(worker_argv, "the warm process did not take the worker")
        return 1
    pid = answer["pid"]
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        handle = None

    def forward(signum, _frame):
        try:
            if handle is not None:
                signal.pidfd_send_signal(handle, signum)
            else:
                os.kill(pid, signum)
        except (ProcessLookupError, PermissionError, OSError):
            pass

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    conn.settimeout(None)
    try:
        ending = _read_line(conn)
    except OSError:
        ending = None
    if not isinstance(ending, dict) or not isinstance(ending.get("status"), int):
        forward(signal.SIGKILL, None)  # the warm process is gone: its worker must not stay
        sys.stderr.write("ddptrain-pod: warm start: the warm process ended before the worker\n")
        return 1
    status = ending["status"]
    if status >= 0:
        return status
    for signum in _FORWARDED:
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), -status)  # end as the worker did: torchrun reads the signal
    return 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
