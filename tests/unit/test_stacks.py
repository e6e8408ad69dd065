"""Stacks, pod side: the answer's parser the operator uses, the workers' registration, the
collection from real (torch-free) worker processes, and GET /stacks on a real server, attacked."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddpjob import contract
from ddptrainer import report, stacks
from ddptrainer.restart_control import EntryControl

pytestmark = pytest.mark.unit

TOKEN = "s" * 40
REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent('''
    import os, sys, time
    from ddptrainer import stacks
    assert stacks.register_from_environment()

    def stuck_in_collective():
        open(os.environ["READY_FILE"], "w").close()
        time.sleep(60)

    stuck_in_collective()
''')


# ----------------------------------------------------------------- parse_stacks
def test_a_well_formed_answer_is_read_and_bounded():
    dump = "\n".join(f'  File "x.py", line {i} in f{i}' for i in range(200))
    parsed = contract.parse_stacks(json.dumps({"ranks": {"1": dump, "0/pid42": "a\x1b[2Jb"}}).encode())
    assert set(parsed) == {"1", "0/pid42"}
    assert len(parsed["1"].splitlines()) == contract.MAX_STACK_LINES
    assert parsed["1"].splitlines()[0].endswith("in f0")  # the innermost frame is kept
    assert parsed["0/pid42"] == "a[2Jb"  # no terminal escapes reach a log


@pytest.mark.parametrize("raw", [
    b"", b"junk", b"[]", b'{"ranks": []}', b'{"ranks": {"x": "y"}}', b'{"ranks": {"1": 2}}',
    b'{"ranks": {"-1": "y"}}', b'{"ranks": {"1": NaN}}', b"[" * 100000,
    json.dumps({"ranks": {str(i): "" for i in range(contract.MAX_STACK_RANKS + 1)}}).encode(),
    json.dumps({"ranks": {"1": "x" * contract.MAX_STACKS_ANSWER_BYTES}}).encode(),
    b'{"ranks": {"1": "\xff"}}',
])
def test_anything_malformed_is_none_and_never_raises(raw):
    assert contract.parse_stacks(raw) is None


def test_a_non_bytes_body_is_none():
    assert contract.parse_stacks("{}") is None  # type: ignore[arg-type]


# ----------------------------------------------------------------- the workers
def test_nothing_is_registered_unless_the_entry_point_asked():
    assert not stacks.register_from_environment({})


def _start_worker(tmp_path, directory, rank):
    ready = tmp_path / f"ready-{rank}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer")]),
               DDPJOB_STACKS_DIR=str(directory), RANK=str(rank), READY_FILE=str(ready))
    proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env)
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.02)
    return proc


@pytest.fixture
def workers(tmp_path):
    directory = tmp_path / "stacks"
    directory.mkdir()
    procs = [_start_worker(tmp_path, directory, rank) for rank in (0, 1)]
    yield directory, procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_the_live_workers_dump_their_stacks(workers):
    directory, procs = workers
    # a file whose pid does not hold it (here: pytest's own) is never signalled: SIGUSR1's
    # default action would kill it
    (directory / stacks.stack_file_name(os.getpid(), 7)).write_text("stale")
    (directory / "not-a-stack-file").write_text("x")
    collector = stacks.StackCollector()
    collector.directory = str(directory)
    started = time.monotonic()
    answer = collector.collect()
    assert time.monotonic() - started < 2
    assert set(answer) == {"0", "1"}
    for text in answer.values():
        first = next(line for line in text.splitlines() if "File" in line)
        assert "stuck_in_collective" in first  # the innermost frame first
    # asked again: a fresh dump, not the previous one appended
    again = collector.collect()
    assert again["0"].count("stuck_in_collective") == answer["0"].count("stuck_in_collective")
    assert all(p.poll() is None for p in procs)  # a dump does not stop a worker


def test_no_workers_no_folder_or_dead_workers_is_none(tmp_path, workers):
    collector = stacks.StackCollector()
    assert collector.collect() is None
    collector.directory = str(tmp_path / "missing")
    assert collector.collect() is None
    directory, procs = workers
    for proc in procs:
        proc.kill()
        proc.wait()
    collector.directory = str(directory)
    assert collector.collect() is None


def test_an_answer_is_bounded_whatever_the_workers_wrote(tmp_path, monkeypatch):
    collector = stacks.StackCollector()
    collector.directory = str(tmp_path)
    paths = []
    for rank in range(10):
        path = tmp_path / stacks.stack_file_name(1000 + rank, rank % 5)
        path.write_text("")
        paths.append(str(path.resolve()))
    monkeypatch.setattr(stacks, "_holds", lambda pid, path: True)
    monkeypatch.setattr(os, "kill", lambda pid, sig: None)
    huge = "\n".join(f'  File "{"x" * 200}.py", line {i} in f' for i in range(500))
    monkeypatch.setattr(collector, "_wait_for_dumps", lambda p, w: [huge] * len(p))
    answer = collector.collect()
    assert len(json.dumps({"ranks": answer})) <= contract.MAX_STACKS_ANSWER_BYTES
    assert contract.parse_stacks(json.dumps({"ranks": answer}).encode()) is not None
    assert "0/pid1000" in answer  # two processes said they were rank 0: both, told apart


# ----------------------------------------------------------------- on a real server
@pytest.fixture
def served(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    control = EntryControl(0, TOKEN)
    server = report.serve_progress(str(tmp_path), port, host="127.0.0.1", control=control)
    assert server is not None
    yield control, port
    server.shutdown()
    server.server_close()


def _get(port, path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer nope", f"Basic {TOKEN}",
                                           f"Bearer {TOKEN}x", "Bearer \u00e9\u00e9"])
def test_without_the_token_it_is_401_and_nothing_is_signalled(served, authorization, monkeypatch):
    control, port = served
    control.stacks.directory = "/nonexistent"
    monkeypatch.setattr(control.stacks, "collect", lambda *a: pytest.fail("collected"))
    headers = {} if authorization is None else {"Authorization": authorization.encode("latin-1")}
    assert _get(port, contract.STACKS_PATH, headers)[0] == 401


def test_no_worker_is_503_and_the_workers_stacks_are_200(served, workers):
    control, port = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert _get(port, contract.STACKS_PATH, auth)[0] == 503  # between attempts
    directory, _ = workers
    control.stacks.directory = str(directory)
    status, raw = _get(port, contract.STACKS_PATH + "?all=1", auth)
    assert status == 200
    parsed = contract.parse_stacks(raw)
    assert set(parsed) == {"0", "1"} and "stuck_in_collective" in parsed["1"]
    assert _get(port, contract.PROGRESS_PATH)[0] == 200  # the rest of the port is untouched


def test_post_to_stacks_is_405(served):
    _, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", contract.STACKS_PATH, body=b"{}", headers={"Authorization": f"Bearer {TOKEN}"})
        assert conn.getresponse().status == 405
    finally:
        conn.close()


def test_the_sitecustomize_registers_only_when_asked(tmp_path):
    site = REPO / "trainer" / "ddptrainer" / "worker_site"
    paths = os.pathsep.join([str(site), str(REPO / "operator"), str(REPO / "trainer")])
    probe = ("import signal, faulthandler, sys\n"
             "registered = faulthandler.unregister(signal.SIGUSR1)\n"
             "print(registered)\n")
    env = dict(os.environ, PYTHONPATH=paths, DDPJOB_INIT_GUARD="0")
    env.pop(contract.DDPJOB_STACKS_DIR, None)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "False", out.stderr
    env[contract.DDPJOB_STACKS_DIR] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "True", out.stderr
    assert list(tmp_path.glob("stack-*-rank-*.txt"))


def test_a_handler_the_program_installs_later_wins(tmp_path):
    paths = os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer")])
    probe = textwrap.dedent('''
        import os, signal, time
        from ddptrainer import stacks
        stacks.register_from_environment()
        got = []
        signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.1)
        print(got == [signal.SIGUSR1])
    ''')
    env = dict(os.environ, PYTHONPATH=paths, DDPJOB_STACKS_DIR=str(tmp_path), RANK="0")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "True", out.stderr
    assert signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None)
