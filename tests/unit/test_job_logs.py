"""`ddpjob logs JOB`: the job's own pods, and a log's bytes -> lines by node and attempt
(ddpjob.client.job_logs, pure), attacked with what a program in the pod can print; and the
command on a fake cluster."""
from __future__ import annotations

import io
import threading
import types

import pytest

from ddpjob import contract
from ddpjob.api import names
from ddpjob.cli import logs as logs_command
from ddpjob.cli.main import build_parser
from ddpjob.client import cluster, job_logs
from ddpjob.client.job_logs import (MAX_LINE_BYTES, LineSplitter, NodePod, PodLogParser, format_line, job_pods,
                                    select, split_timestamp)

pytestmark = pytest.mark.unit
RUN = "0123456789abcdef"
JOB = {"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "train", "namespace": "ns",
                                                                           "uid": "uid-1"},
       "spec": {"nnodes": 2}, "status": {"phase": "Running"}}


def pod(rank: int, *, attempt: int = 0, first: int = 0, uid: str = "uid-1", name: str = "", job: str = "train",
        controller: bool = True, pod_uid: str = "", restarts: int = 0) -> dict:
    return {"status": {"containerStatuses": [{"name": names.CONTAINER_NAME, "restartCount": restarts,
                                              "state": {"running": {}}}]},
            "metadata": {
        "name": name or names.node_pod_name(job, rank), "uid": pod_uid or f"pod-{rank}",
        "labels": {names.LABEL_JOB_NAME: job, names.LABEL_NODE_RANK: str(rank),
                   names.LABEL_RESTART_ATTEMPT: str(attempt)},
        "ownerReferences": [{"apiVersion": names.GROUP_VERSION, "kind": "DDPJob", "name": job, "uid": uid,
                             "controller": controller}]},
        "spec": {"containers": [{"name": names.CONTAINER_NAME,
                                 "env": [{"name": contract.DDPJOB_RESTART_ATTEMPT, "value": str(first)}]}]}}


def parse(lines: list[str], node: NodePod, **kwargs) -> list[job_logs.LogLine]:
    parser = PodLogParser(node, at_log_start=kwargs.pop("at_log_start", True), **kwargs)
    out = []
    for line in lines:
        out += parser.feed(line.encode() if isinstance(line, str) else line)
    return out + parser.finish()


def shown(lines) -> list[str]:
    return [format_line(line) for line in lines]


# --- which pods ---------------------------------------------------------------------------
def test_only_the_jobs_own_pods_are_read():
    pods = [pod(1, attempt=1), pod(0, attempt=1),
            pod(0, uid="someone-else"),  # a look-alike: same labels and name, another owner
            pod(1, controller=False),  # owned, but not as the controller
            pod(2, name="train-node-2-copy"),  # not a name the operator gives
            pod(0, job="other")]
    assert job_pods(JOB, pods) == [NodePod(0, "train-node-0", 0, 1, uid="pod-0"), NodePod(1, "train-node-1", 0, 1, uid="pod-1")]
    assert job_pods({**JOB, "metadata": {"name": "train"}}, [pod(0)]) == []  # no uid: nothing is the job's
    garbled = pod(0)
    garbled["metadata"]["labels"][names.LABEL_NODE_RANK] = "zero"
    assert job_pods(JOB, [garbled]) == []


def test_a_recreated_pod_starts_at_its_own_attempt_and_the_older_logs_are_said_gone():
    [node0, node1] = job_pods(JOB, [pod(0, attempt=2, first=0), pod(1, attempt=2, first=2)])
    assert (node0.first_attempt, node1.first_attempt) == (0, 2)
    note = job_logs.gone_attempts_note([node0, node1])
    assert "earlier attempts" in note and "node-1 since attempt 2" in note and "node-0" not in note
    assert job_logs.gone_attempts_note([node0, node1], selected=2) is None
    assert "attempt 1" in job_logs.gone_attempts_note([node0, node1], selected=1)
    assert job_logs.gone_attempts_note([node0]) is None


# --- lines ----------------------------------------------------------------------------------
def test_lines_are_split_as_bytes_come_and_long_lines_are_cut():
    splitter = LineSplitter(limit=10)
    assert splitter.feed(b"ab") == [] and splitter.feed(b"c\nde") == [b"abc"]
    assert splitter.feed(b"f" * 100 + b"\r\n") == [b"de" + b"f" * 8 + b" ... [93 more bytes cut]"]  # the \\r too
    assert splitter.feed(b"tail") == [] and splitter.finish() == [b"tail"] and splitter.finish() == []


def test_a_line_of_gigabytes_is_held_in_bounded_memory():
    splitter = LineSplitter()
    for _ in range(200):
        assert splitter.feed(b"x" * 1_000_000) == []
        assert len(splitter._part) <= MAX_LINE_BYTES
    [line] = splitter.feed(b"\n")
    assert line.endswith(b"[%d more bytes cut]" % (200_000_000 - MAX_LINE_BYTES))


def test_kubelet_timestamps_sort_with_their_trailing_zeros_dropped():
    a, rest = split_timestamp(b"2026-12-02T13:00:00.1Z hello")
    b, _ = split_timestamp(b"2026-12-02T13:00:00.12Z x")
    assert rest == b"hello" and a < b
    assert split_timestamp(b"no stamp here") == ("", b"no stamp here")


# --- attempts -------------------------------------------------------------------------------
def test_in_place_attempts_get_a_header_each_and_attempt_n_selects_its_lines():
    node = NodePod(1, "train-node-1", 0, 1)
    lines = parse([contract.attempt_mark(0, RUN), "a0", "ddptrain-pod: restarting in place: attempt 1",
                   contract.attempt_mark(1, RUN), "a1"], node)
    assert shown(lines) == ["node-1 ==> attempt 0 (pod train-node-1)", "node-1 | a0",
                            "node-1 | ddptrain-pod: restarting in place: attempt 1",
                            "node-1 ==> attempt 1 (pod train-node-1)", "node-1 | a1"]
    assert [line.text for line in select(lines, 1) if not line.header] == ["a1"]
    assert [line.text for line in select(lines, 0) if not line.header] == [
        "a0", "ddptrain-pod: restarting in place: attempt 1"]


def test_a_forged_mark_cannot_move_or_hide_any_line():
    node = NodePod(0, "train-node-0", 0, 2)
    forged = [contract.attempt_mark(1, "f" * 16),  # a run the program guessed
              contract.attempt_mark(0, RUN) + " ",  # not the whole line
              "x" + contract.attempt_mark(2, RUN)]
    lines = parse([contract.attempt_mark(0, RUN), "real 0", *forged, "still 0"], node)
    assert [line.attempt for line in lines] == [0] * 6
    assert [line.text for line in select(lines, 0) if not line.header] == ["real 0", *forged, "still 0"]
    # A mark printed before the entry point's own (a command that is not the entry point): no
    # run is known, so no mark is believed, and a pod that ran several attempts says so.
    lines = parse([contract.attempt_mark(1, RUN), "who knows"], node)
    assert {line.attempt for line in lines} == {None} and "attempt unknown" in lines[0].text
    assert [line.text for line in lines if not line.header] == [contract.attempt_mark(1, RUN), "who knows"]
    # An attempt below the current one, even with the run, moves nothing back.
    lines = parse([contract.attempt_mark(0, RUN), contract.attempt_mark(2, RUN), contract.attempt_mark(1, RUN),
                   "late"], node)
    assert lines[-1].attempt == 2 and lines[-2].text == contract.attempt_mark(1, RUN)


def test_a_pod_of_one_attempt_needs_no_marks():
    node = NodePod(0, "train-node-0", 3, 3)  # created for attempt 3 (the gang was recreated)
    lines = parse(["from my own command", contract.attempt_mark(7, RUN)], node)
    assert {line.attempt for line in lines} == {3}
    assert shown(lines)[0] == "node-0 ==> attempt 3 (pod train-node-0)"


def test_binary_garbage_and_terminal_escapes_are_shown_escaped():
    node = NodePod(0, "train-node-0", 0, 0)
    lines = parse([b"\xff\xfe\x00bin\x1b[2J\x1b]0;owned\x07", "caf\u00e9 \u202egnp.exe"], node)
    texts = [line.text for line in lines if not line.header]
    assert texts == ["\ufffd\ufffd\\x00bin\\x1b[2J\\x1b]0;owned\\x07", "caf\u00e9 \\u202egnp.exe"]


def test_a_tailed_window_learns_its_attempt_from_the_first_mark_in_it():
    node = NodePod(0, "train-node-0", 0, 2)
    anchor = contract.attempt_mark(0, RUN).encode()
    lines = parse(["end of 1", contract.attempt_mark(2, RUN), "in 2"], node, at_log_start=False, anchor=anchor,
                  window=3)
    assert [(line.attempt, line.text) for line in lines if not line.header] == [(1, "end of 1"), (2, "in 2")]
    # No mark in the window: the pod's attempt now.
    lines = parse(["x", "y"], node, at_log_start=False, anchor=anchor, window=5)
    assert {line.attempt for line in lines} == {2}
    # No anchor (the log's start is rotated away, or not a mark): nothing is believed.
    lines = parse(["x", contract.attempt_mark(2, RUN)], node, at_log_start=False, anchor=b"user text", window=5)
    assert {line.attempt for line in lines} == {None}


def test_what_a_tailed_window_holds_back_is_bounded(monkeypatch):
    monkeypatch.setattr(job_logs, "MAX_HELD_LINES", 5)
    parser = PodLogParser(NodePod(0, "p", 0, 1), at_log_start=False, anchor=contract.attempt_mark(0, RUN).encode())
    out = []
    for i in range(12):
        out += parser.feed(b"line %d" % i)
        assert len(parser._held or ()) < 5
    # Released at the bound (as the pod's attempt now); the lines after it flow through.
    assert [line.attempt for line in out if not line.header] == [1] * 12 and parser.finish() == []


# --- the command on a fake cluster ---------------------------------------------------------
class FakeStream:
    def __init__(self, data: bytes):
        self._data = io.BytesIO(data)
        self.closed = False

    def read1(self, n):
        return self._data.read1(min(n, 7))  # small reads: lines cross chunks

    def read(self, n):
        return self._data.read(n)

    def release_conn(self):
        pass

    def close(self):
        self.closed = True


def stamp(seconds: int, text: str) -> str:
    return f"2026-12-02T13:00:{seconds:02d}.5Z {text}\n"


LOGS = {"train-node-0": stamp(0, contract.attempt_mark(0, RUN)) + stamp(1, "n0 a0") + stamp(4, contract.attempt_mark(1, RUN))
        + stamp(5, "n0 a1"),
        "train-node-1": stamp(0, contract.attempt_mark(0, "a" * 16)) + stamp(2, "n1 a0")
        + stamp(3, contract.attempt_mark(1, "a" * 16)) + stamp(6, "n1 a1")}


FINISHED = {**JOB, "status": {"phase": "Succeeded"}}


def run_logs(monkeypatch, *argv, pods=None, logs=LOGS, jobs=None, later_pods=None, pod_log=None):
    """``jobs``: what get_job answers, call by call (the first is read_job's; then, once these
    run out, the job is Succeeded); ``later_pods``: what the node's listings after the first
    answer (-f looking for a node's next run), call by call."""
    given_pod_log = pod_log
    answers = iter(jobs or [JOB])
    later = iter(later_pods or [])
    listed = pods if pods is not None else [pod(0, attempt=1), pod(1, attempt=1), pod(0, uid="evil")]
    # Once ``later_pods`` runs out, the node's listing stays its last one (a recreated pod
    # does not give way to the one it replaced).
    node_listing = [listed]

    def list_node(selector):
        if names.LABEL_NODE_RANK not in selector:
            return listed
        node_listing[0] = next(later, node_listing[0])
        return node_listing[0]

    monkeypatch.setattr(cluster, "connect", lambda kubeconfig, context: object())
    monkeypatch.setattr(cluster, "get_job", lambda conn, ns, name: next(answers, FINISHED))
    monkeypatch.setattr(cluster, "list_pods", lambda conn, ns, selector: list_node(selector))
    monkeypatch.setattr(logs_command, "NEXT_RUN_POLL_SECONDS", 0.01)

    def pod_log(conn, ns, name, container, **kwargs):
        if name not in logs:
            raise cluster.ClusterError(f'container "trainer" in pod "{name}" is waiting to start', 400)
        return FakeStream(logs[name].encode())

    monkeypatch.setattr(cluster, "pod_log", given_pod_log or pod_log)
    out, err = io.StringIO(), io.StringIO()
    args = build_parser().parse_args(["logs", "train", "-n", "ns", *argv])
    return args.handler(args, out, err), out.getvalue(), err.getvalue()


def test_logs_merge_every_node_in_time_order(monkeypatch):
    code, out, err = run_logs(monkeypatch)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "node-0 ==> attempt 0 (pod train-node-0)", "node-1 ==> attempt 0 (pod train-node-1)",
        "node-0 | n0 a0", "node-1 | n0 a0".replace("n0", "n1"),
        "node-1 ==> attempt 1 (pod train-node-1)", "node-0 ==> attempt 1 (pod train-node-0)",
        "node-0 | n0 a1", "node-1 | n1 a1"]


@pytest.mark.parametrize("follow", [[], ["-f"]])
def test_one_attempt_of_one_node(monkeypatch, follow):
    code, out, err = run_logs(monkeypatch, "--attempt", "0", "--rank", "1", *follow)
    assert code == 0 and out.splitlines() == ["node-1 ==> attempt 0 (pod train-node-1)", "node-1 | n1 a0"], (out, err)


def test_follow_prints_every_node(monkeypatch):
    code, out, _ = run_logs(monkeypatch, "-f")
    assert code == 0 and sorted(out.splitlines()) == sorted([
        "node-0 ==> attempt 0 (pod train-node-0)", "node-0 | n0 a0", "node-0 ==> attempt 1 (pod train-node-0)",
        "node-0 | n0 a1", "node-1 ==> attempt 0 (pod train-node-1)", "node-1 | n1 a0",
        "node-1 ==> attempt 1 (pod train-node-1)", "node-1 | n1 a1"])


def test_older_attempts_of_recreated_pods_are_said_gone(monkeypatch):
    logs = {"train-node-0": stamp(0, contract.attempt_mark(2, RUN)) + stamp(1, "x"), "train-node-1": ""}
    code, out, err = run_logs(monkeypatch, "--attempt", "0", pods=[pod(0, attempt=2, first=2), pod(1, attempt=2, first=2)],
                              logs=logs)
    assert code == 0 and out == ""
    assert "the logs of attempt 0 are gone" in err and "recreated" in err, err


def test_a_pod_without_a_log_yet_is_one_line_and_exit_1(monkeypatch):
    code, out, err = run_logs(monkeypatch, logs={"train-node-0": LOGS["train-node-0"]})
    assert code == 1 and "node-0 | n0 a1" in out
    assert err.strip() == 'ddpjob logs: node-1: container "trainer" in pod "train-node-1" is waiting to start'


def test_a_job_without_pods_says_why(monkeypatch):
    code, out, err = run_logs(monkeypatch, pods=[pod(0, uid="evil")])
    assert code == 1 and out == "" and "has no pod for any node now" in err and "cleanPodPolicy" in err


def test_follow_of_too_many_pods_asks_for_a_rank(monkeypatch):
    monkeypatch.setattr(job_logs, "MAX_FOLLOWED_PODS", 1)
    code, _, err = run_logs(monkeypatch, "-f")
    assert code == 2 and "--rank" in err


@pytest.mark.parametrize("argv", [["--tail", "-1"], ["--attempt", "x"], ["--rank"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["logs", "train", *argv])
    assert exit_.value.code == 2


def test_a_big_gang_is_read_a_batch_of_pods_at_a_time(monkeypatch):
    monkeypatch.setattr(job_logs, "MAX_FOLLOWED_PODS", 1)
    code, out, _ = run_logs(monkeypatch)
    assert code == 0 and out.splitlines()[:2] == ["node-0 ==> attempt 0 (pod train-node-0)", "node-0 | n0 a0"]
    assert "node-1 | n1 a1" in out.splitlines()


def test_a_closed_pipe_ends_quietly(monkeypatch):
    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError

    monkeypatch.setattr(cluster, "connect", lambda kubeconfig, context: object())
    monkeypatch.setattr(cluster, "get_job", lambda conn, ns, name: JOB)
    monkeypatch.setattr(cluster, "list_pods", lambda conn, ns, selector: [pod(0, attempt=1)])
    monkeypatch.setattr(cluster, "pod_log", lambda *a, **k: FakeStream(LOGS["train-node-0"].encode()))
    args = build_parser().parse_args(["logs", "train"])
    assert args.handler(args, Closed(), io.StringIO()) == 0


def test_ctrl_c_ends_a_follow_with_exit_0(monkeypatch):

    class Endless(FakeStream):
        def read1(self, n):
            return b"2026-12-02T13:00:00Z x\n"

    readers: list[threading.Thread] = []

    class Interrupted(logs_command.queue.Queue):
        def get(self, *args, **kwargs):
            readers.extend(t for t in threading.enumerate() if t.name.startswith("log-train-node-"))
            raise KeyboardInterrupt

    monkeypatch.setattr(logs_command.queue, "Queue", Interrupted)
    monkeypatch.setattr(cluster, "connect", lambda kubeconfig, context: object())
    monkeypatch.setattr(cluster, "get_job", lambda conn, ns, name: JOB)
    monkeypatch.setattr(cluster, "list_pods", lambda conn, ns, selector: [pod(0), pod(1)])
    monkeypatch.setattr(cluster, "pod_log", lambda *a, **k: Endless(b""))
    args = build_parser().parse_args(["logs", "train", "-f"])
    err = io.StringIO()
    assert args.handler(args, io.StringIO(), err) == 0 and err.getvalue() == ""
    # The readers stop with the printing: none goes on reading, or asks for a next run (nor
    # calls a later test's fakes).
    for thread in readers:
        thread.join(5)
    assert len(readers) == 2 and not [t.name for t in readers if t.is_alive()]


@pytest.mark.parametrize("next_run", [{"pod_uid": "pod-0-again"}, {"restarts": 1}], ids=["recreated", "kubelet"])
def test_follow_goes_on_into_a_nodes_next_run_until_the_job_is_finished(monkeypatch, next_run):
    """The first run's log ends (its pod deleted for a gang restart, or its container exited
    and the kubelet starts it again): -f waits while the job runs and follows the next run."""
    first = stamp(0, "run one")
    second = stamp(9, "run two")
    reads = iter([first, second])
    nxt = pod(0, attempt=1, first=1, **next_run)
    not_yet = pod(0, attempt=0)  # the same run still: keep waiting
    code, out, err = run_logs(monkeypatch, "-f", "--rank", "0", pods=[pod(0)], jobs=[JOB, JOB, JOB],
                              later_pods=[[not_yet], [nxt]],
                              pod_log=lambda conn, ns, name, container, **kwargs: FakeStream(next(reads).encode()))
    assert (code, err) == (0, ""), err
    assert [line for line in out.splitlines() if "run" in line] == ["node-0 | run one", "node-0 | run two"], out


def test_follow_waits_for_a_container_still_being_created_then_reads_it(monkeypatch):
    """`ddpjob logs -f` (and `submit --follow`) right after the job's creation, on a busy
    cluster: node 1's container is still being created, and the kubelet answers its log with a
    400. Its node is waited for like a next run, then read; before, it was reported unreadable
    and `submit --follow` gave up on the logs (seen on kind under load)."""
    creating = {**pod(1), "status": {"containerStatuses": [
        {"name": names.CONTAINER_NAME, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    started = threading.Event()
    jobs = iter([JOB, JOB])

    def list_pods(conn, ns, selector):
        if names.LABEL_NODE_RANK not in selector:
            return [pod(0), creating]
        if selector.endswith(f"{names.LABEL_NODE_RANK}=0"):
            return [pod(0)]
        started.set()  # node 1's own listing: by now its container is up
        return [pod(1)]

    def pod_log(conn, ns, name, container, **kwargs):
        if name == "train-node-1" and not started.is_set():
            raise cluster.ClusterError('container "trainer" in pod "train-node-1" is waiting to start: '
                                       "ContainerCreating", 400)
        return FakeStream(LOGS[name].encode())

    monkeypatch.setattr(cluster, "connect", lambda kubeconfig, context: object())
    monkeypatch.setattr(cluster, "get_job", lambda conn, ns, name: next(jobs, FINISHED))
    monkeypatch.setattr(cluster, "list_pods", list_pods)
    monkeypatch.setattr(cluster, "pod_log", pod_log)
    monkeypatch.setattr(logs_command, "NEXT_RUN_POLL_SECONDS", 0.01)
    out, err = io.StringIO(), io.StringIO()
    args = build_parser().parse_args(["logs", "train", "-n", "ns", "-f"])
    assert args.handler(args, out, err) == 0, err.getvalue()
    assert err.getvalue() == ""
    lines = out.getvalue().splitlines()
    assert "node-0 | n0 a1" in lines and "node-1 | n1 a0" in lines and "node-1 | n1 a1" in lines, lines


def test_follow_ends_when_the_job_finishes_without_a_next_run(monkeypatch):
    code, out, err = run_logs(monkeypatch, "-f", "--rank", "1")
    assert code == 0 and out.splitlines()[-1] == "node-1 | n1 a1", (out, err)


def test_a_next_run_is_only_the_jobs_own_pod_of_that_rank():
    followed = job_pods(JOB, [pod(0)])[0]
    look_alike = pod(0, uid="evil", pod_uid="other")
    other_rank = pod(1, pod_uid="other")
    assert job_logs.next_run(JOB, [look_alike, other_rank], followed) == (None, True)
    assert job_logs.next_run(None, [], followed) == (None, False)  # the job was deleted
    waiting = {**pod(0, pod_uid="new"), "status": {"containerStatuses": [
        {"name": names.CONTAINER_NAME, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    assert job_logs.next_run(JOB, [waiting], followed) == (None, True)  # no log yet


@pytest.mark.parametrize("status, message, needle", [
    (0, "cannot reach the cluster (https://1.2.3.4): [Errno 111] Connection refused", "is the cluster up?"),
    (403, 'ddpjobs.ddpjob.dev "train" is forbidden', "you may not read ddpjobs"),
])
def test_a_refused_job_read_is_hinted_once(monkeypatch, status, message, needle):
    def get_job(conn, ns, name):
        raise cluster.ClusterError(message, status)

    monkeypatch.setattr(cluster, "connect", lambda kubeconfig, context: object())
    monkeypatch.setattr(cluster, "get_job", get_job)
    out, err = io.StringIO(), io.StringIO()
    args = build_parser().parse_args(["logs", "train", "-n", "ns"])
    code = args.handler(args, out, err)
    text = err.getvalue()
    assert code == 1 and text.count(needle) == 1 and len(text.strip().splitlines()) == 1, text
    assert "you may not read pods" not in text  # the job read was refused, not the pod list


def test_an_unreachable_cluster_is_said_in_a_few_words():
    import urllib3
    refused = urllib3.exceptions.NewConnectionError(
        None, "<urllib3.connection.HTTPSConnection object at 0x7f>: Failed to establish a new "
              "connection: [Errno 111] Connection refused")
    wrapped = urllib3.exceptions.MaxRetryError(None, "/apis/ddpjob.dev/v1/namespaces/ns/ddpjobs/train", refused)
    assert cluster.connection_failure(wrapped) == "[Errno 111] Connection refused"
    assert cluster.connection_failure(TimeoutError("timed out")) == "timed out"
    long = cluster.connection_failure(RuntimeError("x" * 1000))
    assert len(long) <= 160


def test_a_follow_ends_when_a_thread_found_its_next_run_before_the_printing_began(monkeypatch):
    """One done per thread started, however soon a thread adds its node's next run."""

    class AtOnce(threading.Thread):  # the thread's whole work before start() returns
        def start(self):
            self.run()

    monkeypatch.setattr(logs_command, "threading", types.SimpleNamespace(Thread=AtOnce, Event=threading.Event))
    reads = iter([stamp(0, "run one"), stamp(9, "run two")])
    result = []
    follow = threading.Thread(target=lambda: result.append(run_logs(
        monkeypatch, "-f", "--rank", "0", pods=[pod(0)], jobs=[JOB, JOB],
        later_pods=[[pod(0, attempt=1, first=1, pod_uid="pod-0-again")]],
        pod_log=lambda conn, ns, name, container, **kwargs: FakeStream(next(reads).encode()))), daemon=True)
    follow.start()
    follow.join(10)
    assert result, "ddpjob logs -f still waits for a reader that never ran"
    code, out, err = result[0]
    assert (code, err) == (0, "") and "node-0 | run two" in out, (out, err)
