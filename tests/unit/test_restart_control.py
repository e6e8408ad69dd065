"""In-place restart, pod side: the /attempt parser the operator uses, the entry point's state
machine, and the HTTP answers (on a real server, attacked)."""
from __future__ import annotations

import http.client
import json
import socket
import threading

import pytest

from ddpjob import contract
from ddpjob.contract import EntryState, parse_entry_state, parse_permanent_exit_codes
from ddptrainer import report
from ddptrainer.restart_control import EntryControl, answer_get, answer_restart, parse_order

pytestmark = pytest.mark.unit

TOKEN = "t" * 40


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


# ----------------------------------------------------------------- parse_entry_state
def test_a_well_formed_answer_is_read():
    state = parse_entry_state(body(attempt=3, state="failed", exitCode=137, message="killed",
                                   secondsSinceFailure=1.5))
    assert state == EntryState(3, "failed", 137, "killed", 1.5)
    assert parse_entry_state(body(attempt=0, state="running", exitCode=None, message="",
                                  secondsSinceFailure=None)) == EntryState(0, "running")


def test_the_answer_round_trips_through_to_json():
    state = EntryState(2, "stopping", 13, "peer lost", 0.25)
    assert parse_entry_state(json.dumps(state.to_json()).encode()) == state
    trained = EntryState(2, "failed", 137, "killed", 0.25, reported=True)
    assert parse_entry_state(json.dumps(trained.to_json()).encode()) == trained


def test_a_long_message_is_cut_to_the_bound():
    state = parse_entry_state(body(attempt=1, state="failed", exitCode=1, message="x" * 3000))
    assert state is not None and len(state.message) == contract.MAX_ENTRY_MESSAGE_CHARS


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"\xff\xfe", b"[]", b"null", b"42", b'"running"',
    b"[" * 100000 + b"]" * 100000,                       # nesting bomb
    b'{"attempt": 1, "state": "running", "pad": "' + b"x" * 5000 + b'"}',  # over 4 KiB
    body(state="running"),                                # no attempt
    body(attempt=True, state="running"),                  # a bool is not an int
    body(attempt=1.0, state="running"),
    body(attempt="1", state="running"),
    body(attempt=-1, state="running"),
    body(attempt=2**40, state="running"),
    b'{"attempt": 1' + b"0" * 2000 + b', "state": "running"}',  # a huge integer
    body(attempt=1, state="dancing"),
    body(attempt=1, state=["running"]),
    body(attempt=1),
    body(attempt=1, state="failed"),                      # failed without its code
    body(attempt=1, state="failed", exitCode=None),
    body(attempt=1, state="failed", exitCode=False),
    body(attempt=1, state="failed", exitCode=-1),
    body(attempt=1, state="failed", exitCode=256),
    body(attempt=1, state="failed", exitCode="137"),
    body(attempt=1, state="running", message=5),
    body(attempt=1, state="running", message={"a": 1}),
    body(attempt=1, state="failed", exitCode=1, secondsSinceFailure=True),
    body(attempt=1, state="failed", exitCode=1, secondsSinceFailure=-1),
    body(attempt=1, state="failed", exitCode=1, secondsSinceFailure="1"),
    b'{"attempt": 1, "state": "failed", "exitCode": 1, "secondsSinceFailure": NaN}',
    b'{"attempt": 1, "state": "failed", "exitCode": 1, "secondsSinceFailure": Infinity}',
    b'{"attempt": 1, "state": "failed", "exitCode": 1, "secondsSinceFailure": 1e999}',
    b'{"attempt": 1, "state": "failed", "exitCode": 1, "secondsSinceFailure": 1' + b"0" * 400 + b"}",
    body(attempt=1, state="failed", exitCode=1, reported=1),     # a bool, not a truthy value
    body(attempt=1, state="failed", exitCode=1, reported="yes"),
    body(attempt=1, state="failed", exitCode=1, reported=None),
])
def test_anything_malformed_is_none_and_never_raises(raw):
    assert parse_entry_state(raw) is None


def test_a_non_bytes_body_is_none():
    assert parse_entry_state("{}") is None  # type: ignore[arg-type]
    assert parse_entry_state(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("text, codes", [
    (None, contract.DEFAULT_PERMANENT_EXIT_CODES), ("", contract.DEFAULT_PERMANENT_EXIT_CODES),
    ("2,3", (2, 3)), (" 2 , 9 ,2", (2, 9)), ("1,x", contract.DEFAULT_PERMANENT_EXIT_CODES),
    ("0", contract.DEFAULT_PERMANENT_EXIT_CODES), ("256", contract.DEFAULT_PERMANENT_EXIT_CODES),
    ("\u00b2", contract.DEFAULT_PERMANENT_EXIT_CODES), ("2,,3", contract.DEFAULT_PERMANENT_EXIT_CODES),
])
def test_permanent_exit_codes_from_the_environment(text, codes):
    assert parse_permanent_exit_codes(text) == codes


# ----------------------------------------------------------------- the state machine
def test_a_failure_then_an_order_starts_the_next_attempt():
    clock = Clock()
    stops = []
    control = EntryControl(0, TOKEN, stop_workers=lambda: stops.append(1), clock=clock)
    control.workers_active(True)
    control.fail(137, "worker rank 1 exited 137")
    clock.now += 2.5
    state = control.snapshot()
    assert (state.state, state.exit_code, state.seconds_since_failure) == ("failed", 137, 2.5)
    assert control.order(1) == (202, {"attempt": 1, "state": "stopping"})
    assert control.snapshot().state == "stopping" and control.wait_for_order(0) == 1
    assert stops == []  # no workers ran: nothing to stop
    control.begin(1)
    assert control.snapshot() == EntryState(1, "running")


def test_a_failure_says_whether_the_attempts_workers_had_reported(tmp_path):
    """The progress folder holds the attempt's reports (it is emptied before each attempt): one
    is enough for the entry point to vouch, on /attempt, that the attempt trained; the next
    attempt starts unvouched."""
    from ddptrainer.restart_control import clear_progress, progress_reported
    folder = tmp_path / "progress"
    assert not progress_reported(str(folder)) and not progress_reported(None)  # no folder yet
    folder.mkdir()
    (folder / "rank-0.json.123.tmp").write_text("{")  # a write under way is no report
    assert not progress_reported(str(folder))
    assert report.report_progress(3, 10, rank=1, force=True,
                                  environ={contract.DDPJOB_PROGRESS_DIR: str(folder)})
    assert progress_reported(str(folder))
    control = EntryControl(0, TOKEN, clock=Clock())
    control.fail(137, "killed", reported=progress_reported(str(folder)))
    assert control.snapshot().reported is True
    assert json.loads(json.dumps(control.snapshot().to_json()))["reported"] is True
    control.order(1)
    clear_progress(str(folder))
    control.begin(1)
    assert control.snapshot().reported is False and not progress_reported(str(folder))
    control.fail(1, "boom", reported=progress_reported(str(folder)))
    assert control.snapshot().reported is False


def test_an_order_while_the_workers_run_stops_them_and_is_claimed_once():
    stops = []
    control = EntryControl(0, TOKEN, stop_workers=lambda: stops.append(1))
    control.workers_active(True)
    assert control.order(1)[0] == 202
    assert stops == [1]
    assert control.claim_self_signal() and not control.claim_self_signal()
    # the workers end (they saved); the main thread sees the order, not a failure
    control.fail(143, "stopped")
    assert control.snapshot().state == "stopping" and control.ordered == 1


def test_a_retried_order_after_the_restart_is_202_again_and_changes_nothing():
    control = EntryControl(0, TOKEN)
    control.fail(1, "boom")
    assert control.order(1)[0] == 202
    control.begin(1)
    assert control.order(1) == (202, {"attempt": 1, "state": "running"})
    assert control.ordered is None and control.snapshot().state == "running"
    control.fail(1, "boom again")
    assert control.order(1)[0] == 409  # failed at 1: an order for 1 is not one for a restart


def test_an_order_for_the_attempt_a_pod_was_created_at_is_409():
    assert EntryControl(2, TOKEN).order(2)[0] == 409


def test_the_same_order_twice_is_202_twice_and_stops_once():
    stops = []
    control = EntryControl(0, TOKEN, stop_workers=lambda: stops.append(1))
    control.workers_active(True)
    assert control.order(1)[0] == 202 and control.order(1)[0] == 202
    assert stops == [1]


@pytest.mark.parametrize("attempt", [0, 2, 3])
def test_a_stale_order_is_409_and_changes_nothing(attempt):
    control = EntryControl(3, TOKEN)
    control.fail(1, "boom")
    status, answer = control.order(attempt)
    assert status == 409 and answer["attempt"] == 3
    assert control.snapshot().state == "failed" and control.ordered is None


def test_an_older_order_while_starting_is_409_a_newer_one_retargets():
    control = EntryControl(1, TOKEN)
    control.fail(1, "boom")
    assert control.order(3)[0] == 202
    assert control.order(2)[0] == 409
    assert control.order(4)[0] == 202 and control.ordered == 4


def test_no_order_after_the_pod_began_ending():
    control = EntryControl(0, TOKEN)
    control.fail(1, "boom")
    control.end()
    assert control.order(1)[0] == 409
    assert control.wait_for_order(5) is None


def test_waiting_ends_at_the_bound_or_at_the_order():
    control = EntryControl(0, TOKEN)
    control.fail(1, "boom")
    assert control.wait_for_order(0.05) is None
    threading.Timer(0.1, control.order, args=(1,)).start()
    assert control.wait_for_order(5) == 1


# ----------------------------------------------------------------- the answers
def test_ready_is_503_unless_running():
    control = EntryControl(0, TOKEN)
    assert answer_get(control, "/ready")[0] == 200
    control.fail(12, "rendezvous timeout")
    status, answer = answer_get(control, "/ready")
    assert status == 503 and answer["exitCode"] == 12
    assert answer_get(control, "/attempt")[0] == 200
    assert answer_get(control, "/elsewhere") is None


def _restart(control, headers, raw=b""):
    return answer_restart(control, headers, lambda n: raw[:n])


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}",
                                           f"Bearer {TOKEN}x", "Bearer \u00e9\u00e9", f"{TOKEN}"])
def test_no_or_a_wrong_token_is_401_and_changes_nothing(authorization):
    control = EntryControl(0, TOKEN)
    control.fail(1, "boom")
    headers = {"Content-Length": "14"} | ({"Authorization": authorization} if authorization is not None else {})
    assert _restart(control, headers, b'{"attempt": 1}')[0] == 401
    assert control.snapshot().state == "failed" and control.ordered is None


def test_an_empty_token_authorizes_nobody():
    control = EntryControl(0, "")
    assert _restart(control, {"Authorization": "Bearer ", "Content-Length": "14"},
                    b'{"attempt": 1}')[0] == 401


@pytest.mark.parametrize("raw", [b"", b"junk", b"[1]", b'{"attempt": "1"}', b'{"attempt": true}',
                                 b'{"attempt": 1.5}', b'{"attempt": -1}', b'{"attempt": NaN}',
                                 b'{"attempt": null}', b'{"step": 1}', b"\xff"])
def test_junk_is_400(raw):
    control = EntryControl(0, TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Length": str(len(raw))}
    assert _restart(control, headers, raw)[0] == 400
    assert parse_order(raw) is None


@pytest.mark.parametrize("length, status", [(None, 411), ("abc", 400), ("-1", 400),
                                            ("1025", 413), ("99999999999", 400), ("20", 400)])
def test_the_length_is_required_and_bounded(length, status):
    control = EntryControl(0, TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"} | ({"Content-Length": length} if length else {})
    assert _restart(control, headers, b'{"attempt": 1}')[0] == status


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


def _request(port, method, path, raw=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=raw, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_the_server_answers_the_protocol(served):
    control, port = served
    assert _request(port, "GET", "/progress") == (200, b'{"attempt": 0, "ranks": {}}')
    assert _request(port, "GET", "/ready")[0] == 200
    control.fail(137, "worker rank 1 exited 137")
    status, raw = _request(port, "GET", "/ready")
    assert status == 503 and parse_entry_state(raw).exit_code == 137
    order = json.dumps({"attempt": 1}).encode()
    assert _request(port, "POST", "/restart", order)[0] == 401
    assert _request(port, "POST", "/restart", order, {"Authorization": "Bearer nope"})[0] == 401
    assert parse_entry_state(_request(port, "GET", "/attempt")[1]).state == "failed"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert _request(port, "POST", "/restart", b"junk", auth)[0] == 400
    assert _request(port, "POST", "/restart", order, auth) == (202, b'{"attempt": 1, "state": "stopping"}')
    assert _request(port, "POST", "/restart", order, auth)[0] == 202
    assert _request(port, "POST", "/restart", json.dumps({"attempt": 0}).encode(), auth)[0] == 409
    assert _request(port, "POST", "/restart", b"x" * 5000, auth)[0] == 413
    assert _request(port, "POST", "/progress", order, auth)[0] == 405
    assert _request(port, "GET", "/nothing")[0] == 404
    assert control.ordered == 1


def test_a_slow_client_does_not_hold_the_server(served):
    control, port = served
    # Sends headers announcing a body it never sends; another client is answered meanwhile,
    # and the slow one is dropped after the request timeout.
    slow = socket.create_connection(("127.0.0.1", port), timeout=15)
    slow.sendall(f"POST /restart HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                 "Content-Length: 100\r\n\r\n{".encode())
    try:
        assert _request(port, "GET", "/attempt")[0] == 200
        assert slow.recv(100) == b""  # closed without an answer
    finally:
        slow.close()
    assert control.ordered is None


def test_without_a_control_the_server_is_the_progress_server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = report.serve_progress(str(tmp_path), port, host="127.0.0.1")
    try:
        assert _request(port, "GET", "/ready")[0] == 404
        assert _request(port, "POST", "/restart", b"{}")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------- waiting for the master
def test_a_node_waits_until_the_master_runs_the_attempt(served):
    from ddptrainer.rendezvous_wait import wait_for_master_attempt

    control, port = served
    control.fail(137, "killed")
    assert control.order(1)[0] == 202

    def start_attempt_1():
        control.begin(1)

    threading.Timer(0.5, start_attempt_1).start()
    logged = []
    wait_for_master_attempt("127.0.0.1", port, 1, 10, logged.append, interval=0.05)
    assert control.snapshot().attempt == 1
    assert logged == ["waiting for the master to run attempt 1: the master is stopping at attempt 0"]


def test_a_master_outside_the_protocol_is_not_waited_for(tmp_path):
    from ddptrainer.rendezvous_wait import wait_for_master_attempt

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = report.serve_progress(str(tmp_path), port, host="127.0.0.1")  # no /attempt: 404
    logged = []
    try:
        wait_for_master_attempt("127.0.0.1", port, 1, 10, logged.append)
    finally:
        server.shutdown()
        server.server_close()
    assert "does not say its attempt" in logged[0]


def test_a_master_that_never_answers_ends_the_wait_at_the_bound():
    from ddptrainer.rendezvous_wait import MasterUnreachable, wait_for_master_attempt

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens
    with pytest.raises(MasterUnreachable, match="did not run attempt 2"):
        wait_for_master_attempt("127.0.0.1", port, 2, 0.3, lambda _: None, interval=0.05)


# ----------------------------------------------------------------- /progress names its attempt
def test_the_progress_answer_names_the_attempt_its_reports_come_from(tmp_path, monkeypatch):
    """The attempt before's reports stay in the folder until the entry point clears them and
    begins the next: until then they are sent under the attempt before; reports read while
    another attempt began are sent under neither."""
    (tmp_path / contract.progress_file_name(0)).write_text(json.dumps({"step": 40}))
    control = EntryControl(0, TOKEN)
    answer = report.progress_answer(str(tmp_path), control)
    assert answer[contract.PROGRESS_ATTEMPT_KEY] == 0 and set(answer["ranks"]) == {"0"}
    assert control.order(1)[0] == 202
    assert report.progress_answer(str(tmp_path), control)[contract.PROGRESS_ATTEMPT_KEY] == 0
    control.begin(1)
    assert report.progress_answer(str(tmp_path), control)[contract.PROGRESS_ATTEMPT_KEY] == 1
    real_read = contract.read_progress_reports

    def read_while_the_next_begins(directory, now=None):
        control.begin(2)
        return real_read(directory, now)

    monkeypatch.setattr(contract, "read_progress_reports", read_while_the_next_begins)
    raced = report.progress_answer(str(tmp_path), control)
    assert raced["ranks"] == {} and raced[contract.PROGRESS_ATTEMPT_KEY] == 1
    # Without a control (Recreate mode: one attempt per pod) the answer names none.
    monkeypatch.setattr(contract, "read_progress_reports", real_read)
    plain = report.progress_answer(str(tmp_path))
    assert set(plain) == {"ranks"} and plain["ranks"]["0"]["step"] == 40  # (its age is read anew)


SPARE_TREE = r'''
import os, subprocess, sys, time
from ddptrainer.restart_control import kill_descendants
spared = subprocess.Popen([sys.executable, "-c",
                           "import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); "
                           "print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
below_spared = int(spared.stdout.readline())
other = subprocess.Popen(["sleep", "60"])
kill_descendants(spare={spared.pid})
time.sleep(0.5)
def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
print(state(spared.pid), state(below_spared), other.poll())
spared.kill()
'''


def test_a_stop_that_kills_what_is_left_spares_the_warm_process_not_its_workers():
    """The warm process outlives an attempt (its workers below it do not)."""
    import subprocess
    import sys

    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(os.path.join(root, p) for p in ("operator", "trainer"))}
    out = subprocess.run([sys.executable, "-c", SPARE_TREE], capture_output=True, text=True, timeout=60,
                         env=env, check=True).stdout.split()
    spared, below, other = out
    assert spared in ("S", "R") and below in ("Z", "gone") and other == str(-9)


def _control_in(state: str) -> EntryControl:
    """An EntryControl brought to ``state`` the way the entry point gets there."""
    control = EntryControl(1, "t" * 32)
    control.workers_active(True)
    if state == contract.ENTRY_FAILED:
        control.fail(1, "boom")
    elif state == contract.ENTRY_STOPPING:
        assert control.order(2)[0] == 202
    assert control.snapshot().state == state
    return control


# Every state with every event the entry point can meet there (it begins an attempt only once
# one is ordered: from stopping).
EVENTS_MET = [(state, event) for state in contract.ENTRY_STATES
              for event in (contract.ENTRY_ORDER, contract.ENTRY_FAIL, contract.ENTRY_BEGIN)
              if event != contract.ENTRY_BEGIN or state == contract.ENTRY_STOPPING]


@pytest.mark.parametrize("state,event", EVENTS_MET)
def test_every_state_change_is_the_tables(state, event):
    control = _control_in(state)
    if event == contract.ENTRY_ORDER:
        control.order(3)
    elif event == contract.ENTRY_FAIL:
        control.fail(1, "boom")
    else:
        control.begin(control.ordered)
    assert control.snapshot().state == contract.ENTRY_TRANSITIONS.get((state, event), state)


# --- the token's digest: what the operator's pods carry (issue 35, the restart token) -----------
def test_a_pod_with_only_the_digest_takes_the_token_and_nothing_else():
    from ddptrainer.restart_control import read_restart_settings

    digest = contract.restart_token_digest(TOKEN)
    environ = {contract.DDPJOB_RESTART_MODE: "InPlace", contract.DDPJOB_RESTART_TOKEN_SHA256: digest.upper(),
               contract.DDPJOB_PROGRESS_PORT: "29400"}
    settings = read_restart_settings(environ, lambda line: None)
    assert settings is not None and settings.token_sha256 == digest
    control = EntryControl(0, token_sha256=settings.token_sha256)
    for given in (digest, "wrong", TOKEN + "x"):  # the digest itself, what a reader of the pod sees, is no token
        control.fail(1, "boom")
        assert _restart(control, {"Authorization": f"Bearer {given}", "Content-Length": "14"},
                        b'{"attempt": 1}')[0] == 401
    assert _restart(control, {"Authorization": f"Bearer {TOKEN}", "Content-Length": "14"}, b'{"attempt": 1}')[0] == 202


@pytest.mark.parametrize("digest", ["abc", "g" * 64, "0" * 63, "0" * 65])
def test_a_digest_that_is_not_one_turns_in_place_off_and_says_so(digest):
    from ddptrainer.restart_control import read_restart_settings

    said: list[str] = []
    environ = {contract.DDPJOB_RESTART_MODE: "InPlace", contract.DDPJOB_RESTART_TOKEN_SHA256: digest,
               contract.DDPJOB_RESTART_TOKEN: TOKEN, contract.DDPJOB_PROGRESS_PORT: "29400"}
    assert read_restart_settings(environ, said.append) is None
    assert said and contract.DDPJOB_RESTART_TOKEN_SHA256 in said[0]


# --- when the warm process starts (DDPJOB_WARM_START_AFTER_SECONDS) ------------------------------
@pytest.mark.parametrize("value, expected", [(None, contract.DEFAULT_WARM_START_AFTER_SECONDS), ("0", 0), ("5", 5)])
def test_the_warm_start_delay_is_read_from_the_pod_environment(value, expected):
    from ddptrainer.restart_control import read_restart_settings

    environ = {contract.DDPJOB_RESTART_MODE: "InPlace", contract.DDPJOB_RESTART_TOKEN: TOKEN,
               contract.DDPJOB_PROGRESS_PORT: "29400"}
    if value is not None:
        environ[contract.DDPJOB_WARM_START_AFTER_SECONDS] = value
    settings = read_restart_settings(environ, lambda line: None)
    assert settings is not None and settings.warm_start_after_seconds == expected


@pytest.mark.parametrize("value", ["-1", "soon", "1.5"])
def test_a_warm_start_delay_that_is_no_count_of_seconds_is_refused_by_name(value):
    from ddptrainer.restart_control import read_restart_settings
    from ddptrainer.text import BadInteger

    environ = {contract.DDPJOB_RESTART_MODE: "InPlace", contract.DDPJOB_RESTART_TOKEN: TOKEN,
               contract.DDPJOB_PROGRESS_PORT: "29400", contract.DDPJOB_WARM_START_AFTER_SECONDS: value}
    with pytest.raises(BadInteger) as raised:
        read_restart_settings(environ, lambda line: None)
    assert contract.DDPJOB_WARM_START_AFTER_SECONDS in str(raised.value) and value in str(raised.value)
