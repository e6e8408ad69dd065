"""In-place gang restart, pod side: real entry points, real torchrun, real gloo ranks.

Two "pods" are two ``ddptrain-pod`` processes on 127.0.0.1 (node ranks 0 and 1, one worker
each, each serving the restart protocol on a port of its own); the test plays the operator.
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import textwrap
import time

import pytest

from ddpjob import contract
from ddptrainer import checkpoint

pytestmark = pytest.mark.multiprocess

TOKEN = "inplace-test-token-0123456789abcdef"

# The built-in trainer, its steps slowed in attempt 0 only, so that the test can kill a worker
# after the checkpoint of step 4 and before the end; each worker leaves its pid behind.
SLOW_FIRST_ATTEMPT = textwrap.dedent('''
    import os, sys, time
    warm = "torch" in sys.modules  # forked from the warm process: torch is imported already
    from ddptrainer import main, train

    attempt = os.environ["DDPJOB_RESTART_ATTEMPT"]
    with open(os.path.join(os.environ["PID_DIR"], f"rank-{os.environ['RANK']}-attempt-{attempt}.pid"), "w") as f:
        f.write(str(os.getpid()))
    with open(os.path.join(os.environ["PID_DIR"], f"rank-{os.environ['RANK']}-attempt-{attempt}.warm"), "w") as f:
        f.write(str(warm))
    if attempt == "0":
        original = train.Trainer._run_batch

        def slow(self, batch):
            time.sleep(0.4)
            return original(self, batch)

        train.Trainer._run_batch = slow
    sys.exit(main.run(sys.argv[1:]))
''')

TRAIN_ARGS = ("--fake-size", "128", "--epochs", "1", "--max-steps", "8", "--checkpoint-every", "4",
              "--log-format", "json", "--log-every", "1")

KILL_MYSELF = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
EXIT_2 = "import sys\nsys.exit(2)\n"


def _get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _order(port, attempt, token=TOKEN):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", contract.RESTART_PATH, body=json.dumps({"attempt": attempt}),
                     headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _state(port):
    try:
        return contract.parse_entry_state(_get(port, contract.ATTEMPT_PATH)[1])
    except OSError:
        return None


def _wait_for_state(port, proc, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = _state(port)
        if state is not None and predicate(state):
            return state
        assert proc.poll() is None, f"the entry point exited {proc.returncode} before {what}"
        time.sleep(0.1)
    raise AssertionError(f"not {what} within {timeout}s: {state}")


def _inplace_env(env, tmp_path, name, port, **extra):
    progress = tmp_path / f"progress-{name}"
    return dict(env, DDPJOB_RESTART_MODE=contract.RESTART_MODE_IN_PLACE,
                DDPJOB_RESTART_TOKEN=TOKEN, DDPJOB_PROGRESS_PORT=str(port),
                DDPJOB_PROGRESS_DIR=str(progress), DDPJOB_RESTART_ATTEMPT="0",
                DDPJOB_TERMINATION_LOG=str(tmp_path / f"term-{name}"), **extra)


def _json_events(text):
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    return events


@pytest.mark.timeout(240)
def test_a_killed_worker_is_restarted_in_place_and_resumes(mp, tmp_path, trainer_env):
    script = tmp_path / "slow_trainer.py"
    script.write_text(SLOW_FIRST_ATTEMPT)
    ckpt = tmp_path / "ckpt"
    pids = tmp_path / "pids"
    pids.mkdir()
    master_port, ports = mp.free_port(), {0: mp.free_port(), 1: mp.free_port()}
    logs = {rank: tmp_path / f"node-{rank}.log" for rank in (0, 1)}
    procs = {}
    try:
        for rank in (0, 1):
            env = _inplace_env(trainer_env, tmp_path, rank, ports[rank], PID_DIR=str(pids),
                               PET_NNODES="2", PET_NODE_RANK=str(rank), PET_NPROC_PER_NODE="1",
                               PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(master_port),
                               DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS="60",
                               DDPJOB_RESTART_GRACE_SECONDS="20",
                               DDPJOB_RESTART_WAIT_SECONDS="120",
                               DDPJOB_WARM_START_AFTER_SECONDS="0",  # warm from the first report
                               DDPJOB_MASTER_PROGRESS_PORT=str(ports[0]))
            procs[rank] = mp.start(mp.pod_entry("--script", str(script), *mp.TINY, *TRAIN_ARGS,
                                                "--checkpoint-dir", str(ckpt)), env, logs[rank])
        for rank in (0, 1):
            _wait_for_state(ports[rank], procs[rank], lambda s: s.state == "running", 30, "serving")
            assert _get(ports[rank], contract.READY_PATH)[0] == 200
        # SIGKILL node 1's worker once the checkpoint of step 4 is on disk, mid-training
        deadline = time.monotonic() + 90
        while 4 not in [s for s, _ in checkpoint.list_checkpoints(str(ckpt))]:
            assert time.monotonic() < deadline, logs[0].read_text()[-3000:]
            assert all(p.poll() is None for p in procs.values()), logs[1].read_text()[-3000:]
            time.sleep(0.1)
        os.kill(int((pids / "rank-1-attempt-0.pid").read_text()), signal.SIGKILL)

        failed = _wait_for_state(ports[1], procs[1], lambda s: s.state == "failed", 30, "failed")
        assert failed.attempt == 0 and failed.exit_code == 137, failed
        assert "worker rank 1 exited 137" in failed.message
        # it had trained (reported progress): the operator then restarts it in place again
        # even if its own poll of /progress missed the attempt
        assert failed.reported is True, failed
        status, raw = _get(ports[1], contract.READY_PATH)
        assert status == 503 and contract.parse_entry_state(raw).exit_code == 137
        assert "exit 137" in (tmp_path / "term-1").read_text()  # written while it waits
        time.sleep(1)
        assert procs[1].poll() is None  # it waits for an order, it does not exit

        # without the token, or with a wrong one: 401, and nothing changes
        assert _order(ports[1], 1, token=None)[0] == 401
        assert _order(ports[1], 1, token="wrong")[0] == 401
        state = _state(ports[1])
        assert (state.attempt, state.state) == (0, "failed")

        # the operator's order: attempt 1, to both nodes (node 0 failed too, or still runs)
        for rank in (0, 1):
            assert _order(ports[rank], 1)[0] == 202
            assert _order(ports[rank], 1)[0] == 202  # a retry: accepted again
            assert _order(ports[rank], 0)[0] == 409  # stale
        codes = {rank: p.wait(timeout=120) for rank, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    out = {rank: logs[rank].read_text() for rank in (0, 1)}
    assert codes == {0: 0, 1: 0}, out[0][-3000:] + out[1][-3000:]
    for rank in (0, 1):
        assert "restarting in place: attempt 1" in out[rank]
        # `ddpjob logs` reads the attempts from the marks: the first line, then one per restart
        marks = [contract.parse_attempt_mark(line) for line in out[rank].splitlines()]
        assert marks[0] is not None and [m for m in marks if m] == [(0, marks[0][1]), (1, marks[0][1])]
        # the same entry point (not a new process) ran both attempts
        assert (pids / f"rank-{rank}-attempt-0.pid").exists()
        assert (pids / f"rank-{rank}-attempt-1.pid").exists()
        # attempt 0 started cold; attempt 1's workers were forked from the warm process
        assert (pids / f"rank-{rank}-attempt-0.warm").read_text() == "False"
        assert (pids / f"rank-{rank}-attempt-1.warm").read_text() == "True", out[rank][-3000:]
        assert "workers start from the warm process" in out[rank]
    starts = [e for e in _json_events(out[0]) if e.get("event") == "start"]
    assert [s["step"] for s in starts] == [0, 4], starts  # attempt 1 resumed from step 4
    done = [e for e in _json_events(out[0]) if e.get("event") == "done"]
    assert done and done[-1]["step"] == 8
    assert "completed" in (tmp_path / "term-0").read_text()


@pytest.mark.timeout(60)
def test_no_order_in_time_exits_with_the_failures_code(mp, tmp_path, trainer_env):
    script = tmp_path / "die.py"
    script.write_text(KILL_MYSELF)
    port = mp.free_port()
    env = _inplace_env(trainer_env, tmp_path, 0, port, DDPJOB_RESTART_WAIT_SECONDS="3")
    log = tmp_path / "pod.log"
    proc = mp.start(mp.pod_entry("--script", str(script)), env, log)
    try:
        failed = _wait_for_state(port, proc, lambda s: s.state == "failed", 40, "failed")
        since = time.monotonic()
        assert failed.exit_code == 137
        assert failed.reported is False  # it died before any progress report
        assert _get(port, contract.READY_PATH)[0] == 503
        code = proc.wait(timeout=20)
        waited = time.monotonic() - since
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 137, log.read_text()[-3000:]
    assert 1.5 <= waited <= 10
    assert "no restart order within 3s: exiting 137" in log.read_text()
    assert "exit 137" in (tmp_path / "term-0").read_text()


@pytest.mark.timeout(60)
def test_a_permanent_code_exits_at_once(mp, tmp_path, trainer_env):
    script = tmp_path / "bad.py"
    script.write_text(EXIT_2)
    env = _inplace_env(trainer_env, tmp_path, 0, mp.free_port(), DDPJOB_RESTART_WAIT_SECONDS="60")
    started = time.monotonic()
    proc = mp.run(mp.pod_entry("--script", str(script)), env, timeout=50)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert time.monotonic() - started < 40  # it did not wait for an order
    assert "waiting up to" not in proc.stderr


@pytest.mark.timeout(60)
def test_the_job_s_permanent_codes_are_the_ones_that_do_not_wait(mp, tmp_path, trainer_env):
    """failurePolicy.permanentExitCodes: 137 listed, so a SIGKILLed worker ends the pod."""
    script = tmp_path / "die.py"
    script.write_text(KILL_MYSELF)
    env = _inplace_env(trainer_env, tmp_path, 0, mp.free_port(), DDPJOB_RESTART_WAIT_SECONDS="60",
                       DDPJOB_PERMANENT_EXIT_CODES="2,137")
    proc = mp.run(mp.pod_entry("--script", str(script)), env, timeout=50)
    assert proc.returncode == 137, proc.stderr[-3000:]
    assert "waiting up to" not in proc.stderr


@pytest.mark.timeout(60)
def test_the_kubelet_s_sigterm_while_waiting_ends_the_pod(mp, tmp_path, trainer_env):
    script = tmp_path / "die.py"
    script.write_text(KILL_MYSELF)
    port = mp.free_port()
    env = _inplace_env(trainer_env, tmp_path, 0, port, DDPJOB_RESTART_WAIT_SECONDS="60")
    log = tmp_path / "pod.log"
    proc = mp.start(mp.pod_entry("--script", str(script)), env, log)
    try:
        _wait_for_state(port, proc, lambda s: s.state == "failed", 40, "failed")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 143, log.read_text()[-3000:]
    assert "while waiting for a restart order" in (tmp_path / "term-0").read_text()


STUCK = textwrap.dedent('''
    import os, time
    from ddptrainer.report import report_progress

    def stuck_in_collective():
        open(os.path.join(os.environ["PID_DIR"], f"rank-{os.environ['RANK']}.stuck"), "w").write(str(os.getpid()))
        time.sleep(300)

    report_progress(step=1, force=True)
    stuck_in_collective()
''')


@pytest.mark.timeout(120)
def test_the_stacks_of_stuck_workers_name_the_function_they_are_stuck_in(mp, tmp_path, trainer_env):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    pids = tmp_path / "pids"
    pids.mkdir()
    port = mp.free_port()
    env = _inplace_env(trainer_env, tmp_path, 0, port, PID_DIR=str(pids), PET_NPROC_PER_NODE="2",
                       DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS="60", DDPJOB_RESTART_GRACE_SECONDS="5")
    log = tmp_path / "node.log"
    proc = mp.start(mp.pod_entry("--script", str(script)), env, log)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        _wait_for_state(port, proc, lambda s: s.state == "running", 30, "serving")
        deadline = time.monotonic() + 60
        while len(list(pids.glob("*.stuck"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", contract.STACKS_PATH)
        assert conn.getresponse().status == 401
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        started = time.monotonic()
        conn.request("GET", contract.STACKS_PATH, headers=auth)
        response = conn.getresponse()
        status, raw = response.status, response.read()
        conn.close()
        assert time.monotonic() - started < 3
        assert status == 200, raw
        answer = contract.parse_stacks(raw)
        assert set(answer) == {"0", "1"}, answer
        for text in answer.values():
            frames = [line for line in text.splitlines() if "File" in line]
            assert "stuck_in_collective" in frames[0], text
        assert proc.poll() is None  # the dump stops nothing
    finally:
        proc.kill()
        proc.wait()
        for stuck in pids.glob("*.stuck"):
            try:
                os.kill(int(stuck.read_text()), signal.SIGKILL)
            except (ValueError, OSError):
                pass
