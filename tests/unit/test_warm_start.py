"""Warm start (ddptrainer/warm_start.py): a real warm process (without the torch preload, so that
it starts at once) and real clients, as torchrun would run them; attacked with malformed and
oversized requests."""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from ddpjob import contract
from ddptrainer import init_guard, warm_start

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATHS = os.pathsep.join(os.path.join(ROOT, p) for p in ("operator", "trainer"))

WORKER = textwrap.dedent('''
    import os, signal, sys, time
    import sibling
    out = os.environ["OUT"]
    def on_term(signum, frame):
        open(out + ".term", "w").write("TERM")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    with open(out, "w") as f:
        f.write(repr({"argv": sys.argv, "x": os.environ.get("X"), "cwd": os.getcwd(),
                      "pid": os.getpid(), "sibling": sibling.VALUE,
                      "main": sys.modules["__main__"].__file__}))
    print("hello from", sys.argv[1:], flush=True)
    action = os.environ.get("ACTION", "exit")
    if action == "sleep":
        time.sleep(60)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise ValueError("a bug in the script")
    sys.exit(int(os.environ.get("CODE", "0")))
''')


@pytest.fixture
def warm(tmp_path):
    """A warm process serving on tmp_path/socket (its lifeline: our pipe to its stdin)."""
    path = str(tmp_path / "socket")
    code = ("import sys; from ddptrainer import warm_start; warm_start.PRELOAD = ('json',); "
            "warm_start._preload(print); warm_start.serve(sys.argv[1])")
    env = dict(os.environ, PYTHONPATH=PATHS)
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 20
    while not warm_start._answers(path):
        assert proc.poll() is None and time.monotonic() < deadline, "the warm process did not serve"
        time.sleep(0.05)
    yield path, proc
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=10)


@pytest.fixture
def script(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "worker.py").write_text(WORKER)
    (folder / "sibling.py").write_text("VALUE = 42\n")  # next to the script: sys.path[0]
    return folder / "worker.py"


def client(path, worker_argv, tmp_path, **env):
    environ = {**os.environ, "PYTHONPATH": PATHS, "OUT": str(tmp_path / "out"), **env}
    return subprocess.Popen([sys.executable, "-S", warm_start.CLIENT, path, "--", *worker_argv],
                            env=environ, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def seen(tmp_path):
    return eval((tmp_path / "out").read_text())  # noqa: S307 - our own test worker's repr


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_worker_runs_with_the_clients_argv_environment_folder_and_streams(warm, script, tmp_path):
    path, _ = warm
    proc = client(path, [str(script), "--lr", "0.1"], tmp_path, X="the client's", CODE="7")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7, err  # the worker's exit code is the client's
    assert "hello from ['--lr', '0.1']" in out  # the worker wrote to the client's stdout
    facts = seen(tmp_path)
    assert facts["argv"] == [str(script), "--lr", "0.1"] and facts["x"] == "the client's"
    assert facts["cwd"] == str(tmp_path) and facts["sibling"] == 42 and facts["main"] == str(script)
    assert facts["pid"] != proc.pid  # forked by the warm process, not run by the client
    assert "warm start" not in err  # no fallback


def test_a_module_runs_as_main(warm, script, tmp_path):
    path, _ = warm
    proc = client(path, ["-m", "worker", "x"], tmp_path, PYTHONPATH=PATHS + os.pathsep + str(script.parent))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert seen(tmp_path)["argv"][1:] == ["x"] and seen(tmp_path)["main"] == str(script)


def test_a_worker_killed_by_a_signal_ends_its_client_by_the_same_signal(warm, script, tmp_path):
    path, _ = warm
    proc = client(path, [str(script)], tmp_path, ACTION="kill")
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL  # torchrun reads 137, as for a worker of its own


def test_a_traceback_names_the_script_not_the_warm_process(warm, script, tmp_path):
    path, _ = warm
    proc = client(path, [str(script)], tmp_path, ACTION="raise")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "ValueError: a bug in the script" in err and str(script) in err
    assert "warm_start.py" not in err and "runpy" not in err


def test_a_signal_to_the_client_reaches_the_worker(warm, script, tmp_path):
    """torchrun stops a worker with SIGTERM to the process it started: the worker saves (here
    it writes a file) and its exit is the client's."""
    path, _ = warm
    proc = client(path, [str(script)], tmp_path, ACTION="sleep")
    wait_for(lambda: (tmp_path / "out").exists())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 143 and (tmp_path / "out.term").read_text() == "TERM"


def test_a_client_that_dies_takes_its_worker(warm, script, tmp_path):
    """torchrun's SIGKILL after its grace reaches the client only: the worker must not stay."""
    path, proc_warm = warm
    proc = client(path, [str(script)], tmp_path, ACTION="sleep")
    wait_for(lambda: (tmp_path / "out").exists())
    worker = seen(tmp_path)["pid"]
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(lambda: gone(worker))
    assert proc_warm.poll() is None  # the warm process serves on


def test_the_warm_process_ends_with_its_lifeline_and_its_workers_with_it(warm, script, tmp_path):
    path, proc_warm = warm
    proc = client(path, [str(script)], tmp_path, ACTION="sleep")
    wait_for(lambda: (tmp_path / "out").exists())
    worker = seen(tmp_path)["pid"]
    proc_warm.stdin.close()  # the entry point ended
    assert proc_warm.wait(timeout=10) == 0
    wait_for(lambda: gone(worker))
    proc.communicate(timeout=30)
    assert proc.returncode == 1  # the client says so and does not hang


def test_without_a_warm_process_the_client_starts_the_worker_as_usual(script, tmp_path):
    proc = client(str(tmp_path / "no-socket"), [str(script), "a"], tmp_path, X="fallback", CODE="3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "hello from ['a']" in out
    assert "starting the worker as usual" in err
    facts = seen(tmp_path)
    assert facts["x"] == "fallback" and facts["pid"] == proc.pid  # exec'd: the client became it


def _raw_request(path, payload, fds=()):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(path)
        socket.send_fds(conn, [payload], list(fds)) if fds else conn.sendall(payload)
        try:
            return conn.recv(100)
        except (socket.timeout, OSError):
            return b"timeout"


@pytest.mark.parametrize("payload, with_fds", [
    (b"\x00", False),                                                 # short of a header
    (struct.pack("!I", warm_start.MAX_REQUEST_BYTES + 1) + b"{}", True),  # over the bound
    (struct.pack("!I", 5) + b"nope!", True),                          # not JSON
    (struct.pack("!I", 2) + b"[]", True),                             # not an object
    (struct.pack("!I", 100) + b"{", True),                            # cut short
])
def test_a_malformed_request_forks_nothing_and_the_process_serves_on(warm, script, tmp_path, payload, with_fds):
    path, proc_warm = warm
    fds = (0, 1, 2) if with_fds else ()
    assert _raw_request(path, payload, fds) == b""  # closed without an answer
    assert proc_warm.poll() is None and warm_start._answers(path)


@pytest.mark.parametrize("fields", [
    {"argv": ["-c", "print(1)"], "env": {}, "cwd": "/"},   # only a script or -m module
    {"argv": [], "env": {}, "cwd": "/"},
    {"argv": ["x.py"], "env": {"A": 1}, "cwd": "/"},       # environment values are strings
    {"argv": ["x.py"], "env": {}, "cwd": None},
    {"argv": "x.py", "env": {}, "cwd": "/"},
])
def test_a_request_outside_the_protocol_forks_nothing(warm, fields):
    path, proc_warm = warm
    body = json.dumps(fields).encode()
    assert _raw_request(path, struct.pack("!I", len(body)) + body, (0, 1, 2)) == b""
    assert proc_warm.poll() is None


def test_requests_without_streams_fork_nothing(warm):
    path, _ = warm
    body = json.dumps({"argv": ["x.py"], "env": {}, "cwd": "/"}).encode()
    assert _raw_request(path, struct.pack("!I", len(body)) + body) == b""


def test_the_socket_is_in_a_folder_of_this_user_only(monkeypatch):
    started = []

    class Process:  # the warm process, not started: what it is given is what is checked
        pid = 12345
        stdin = None

        def __init__(self, argv, **kwargs):
            started.append((argv, kwargs["env"]))

        def poll(self):
            return None

        def wait(self, timeout=None):
            return 0

        def kill(self):  # a stop before it serves (no socket)
            pass

    monkeypatch.setattr(warm_start.subprocess, "Popen", Process)
    starter = warm_start.WarmStart({"DDPJOB_STACKS_DIR": "/x", "PYTHONPATH": init_guard.site_dir()},
                                   log=lambda _m: None)
    starter.start()
    starter.start()  # once
    folder = os.path.dirname(starter.socket_path)
    assert os.stat(folder).st_mode & 0o077 == 0 and len(started) == 1
    argv, env = started[0]
    assert argv[-1] == starter.socket_path and "DDPJOB_STACKS_DIR" not in env and "PYTHONPATH" not in env
    assert starter.pids() == (12345,)
    assert starter.worker_command(["train.py", "--x"])[-3:] == ["--", "train.py", "--x"]
    starter.stop()
    assert not os.path.exists(folder) and starter.pids() == ()


def test_the_warm_process_environment_leaves_out_the_per_worker_parts():
    env = warm_start.warm_process_environment({
        contract.DDPJOB_STACKS_DIR: "/tmp/stacks", "PYTHONPATH": os.pathsep.join([init_guard.site_dir(), "/code"]),
        "KEEP": "1"})
    assert env == {"PYTHONPATH": "/code", "KEEP": "1"}


def test_warm_start_is_on_unless_turned_off():
    assert warm_start.enabled({}) and warm_start.enabled({contract.DDPJOB_WARM_START: "1"})
    assert not warm_start.enabled({contract.DDPJOB_WARM_START: "0"})


def _recording_warm(monkeypatch) -> tuple[warm_start.WarmStart, list[float]]:
    handle = warm_start.WarmStart({}, lambda line: None)
    started: list[float] = []

    def start() -> None:  # what the real start does first: it is started from then on
        started.append(time.monotonic())
        handle._proc = object()  # type: ignore[assignment]

    monkeypatch.setattr(handle, "start", start)
    return handle, started


def test_the_warm_process_starts_only_after_the_workers_have_reported_for_the_delay(tmp_path, monkeypatch):
    """A job that ends (or fails) before the delay never pays for the warm process's import."""
    handle, started = _recording_warm(monkeypatch)
    handle.start_once_reporting(str(tmp_path), after_seconds=1.0, poll_seconds=0.05)
    time.sleep(1.5)
    assert started == []  # no report yet: however long the attempt runs, nothing starts
    (tmp_path / "rank-0.json").write_text("{}")
    reported_at = time.monotonic()
    deadline = reported_at + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started, "the warm process never started"
    assert started[0] - reported_at >= 0.9  # the delay runs from the first report


def test_with_no_delay_the_warm_process_starts_at_the_first_report(tmp_path, monkeypatch):
    handle, started = _recording_warm(monkeypatch)
    (tmp_path / "rank-1.json").write_text("{}")
    handle.start_once_reporting(str(tmp_path), after_seconds=0, poll_seconds=0.05)
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(started) == 1


def test_a_start_before_the_delay_ends_the_wait_and_starts_nothing_more(tmp_path, monkeypatch):
    """A failure starts the warm process at once (pod_entry): the watch then has nothing to do."""
    handle, started = _recording_warm(monkeypatch)
    (tmp_path / "rank-0.json").write_text("{}")
    handle.start_once_reporting(str(tmp_path), after_seconds=0.5, poll_seconds=0.05)
    handle.start()  # the failure's
    time.sleep(1.0)
    assert len(started) == 1


def test_stopping_a_warm_process_still_importing_kills_it_at_once(tmp_path):
    """It reads its lifeline only once it serves: waiting for it held the pod's exit (a give-up
    or the kubelet's SIGTERM) up to 5 s while torch imported on a loaded machine."""
    handle = warm_start.WarmStart({}, lambda line: None)
    importing = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    handle._proc, handle.socket_path = importing, str(tmp_path / "socket")  # no socket yet
    started = time.monotonic()
    handle.stop()
    assert importing.poll() is not None and time.monotonic() - started < 3
    assert importing.returncode == -signal.SIGKILL


def test_nothing_starts_the_warm_process_after_the_pod_s_attempts_are_over(tmp_path, monkeypatch):
    """The watch outlives a short attempt: a stop (the pod ends) must keep its delay from
    starting a warm process while the entry point exits."""
    handle = warm_start.WarmStart({}, lambda line: None)
    spawned = []
    monkeypatch.setattr(warm_start.subprocess, "Popen", lambda *a, **k: spawned.append(a))
    (tmp_path / "rank-0.json").write_text("{}")
    handle.start_once_reporting(str(tmp_path), after_seconds=0.5, poll_seconds=0.05)
    handle.stop()
    time.sleep(1.0)
    handle.start()
    assert spawned == [] and not handle.started
