"""`ddpjob logs JOB`: the log of every node of a job, merged, each line marked with its node.

  node-0 ==> attempt 0 (pod train-node-0)
  node-0 | epoch 1 step 20 loss 2.31
  node-1 | epoch 1 step 20 loss 2.29

A header line (==>) marks where a node's attempt begins: with the default in-place restarts a
pod keeps running across attempts and its log holds them all; --attempt N shows one. Where the
gang was recreated, the older attempts' pods are gone and their logs with them (a line on
stderr says so). Only the job's own pods are read (its labels and its ownership), through the
API server, with your kubeconfig. -f follows every node at once, on into a node's next pod or
restarted container, until the job is finished or you press Ctrl-C.
"""
from __future__ import annotations

import argparse
import heapq
import os
import queue
import sys
import threading
from typing import Any, Iterator, Optional, TextIO

from ddpjob.api import names, progress_plot
from ddpjob.cli.common import add_cluster_arguments, read_job
from ddpjob.client import job_logs
from ddpjob.client.job_logs import LineSplitter, LogLine, NodePod, PodLogParser, format_line, split_timestamp

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
CHUNK_BYTES = 64 * 1024
#: Bytes of a log's start read for its first line (the attempt mark) under --tail.
ANCHOR_BYTES = 256
#: Lines waiting to be printed while following (the readers wait when it is full).
QUEUE_LINES = 10_000


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "logs", help="every node's log of a job, merged, each line marked with its node and attempt (-f: follow)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  ddpjob logs train -n team-a\n  ddpjob logs train -f --tail 20\n"
        "  ddpjob logs train --rank 1 --attempt 0\n"
        "Exit 0 when the logs were read (or -f ended with Ctrl-C), 1 when the job, its pods or a\n"
        "log cannot be read, 2 for bad flags. See docs/status-and-logs.md.")
    add_cluster_arguments(parser)
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C")
    parser.add_argument("--rank", type=_count, metavar="NODE_RANK", help="only this node's log")
    parser.add_argument("--attempt", type=_count, metavar="N", help="only the lines of attempt N")
    parser.add_argument("--tail", type=_count, metavar="N", help="start each node's log N lines from its end")
    parser.set_defaults(handler=run_logs)
    return parser


def run_logs(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        return _run_logs(args, out, err)
    except KeyboardInterrupt:  # Ctrl-C ends `ddpjob logs -f`, the way it is meant to end
        return EXIT_OK


def _run_logs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ddpjob.client import cluster

    def fail(message: str, code: int = EXIT_FAILED) -> int:
        print(f"ddpjob logs: error: {message}", file=err)
        return code

    try:
        conn, job = read_job(args)
        listed = cluster.list_pods(conn, args.namespace, f"{names.LABEL_JOB_NAME}={args.job}")
    except cluster.ClusterError as error:
        return fail(cluster.hint(error, args.namespace, "pods"))
    pods = [p for p in job_logs.job_pods(job, listed) if args.rank is None or p.node_rank == args.rank]
    if not pods:
        phase = (job.get("status") or {}).get("phase") or "no phase yet"
        which = f"node {args.rank}" if args.rank is not None else "any node"
        return fail(f"DDPJob {args.namespace}/{args.job} ({phase}) has no pod for {which} now: not created "
                    "yet, or deleted (a finished job's pods go with spec.cleanPodPolicy, their logs with them)")
    note = job_logs.gone_attempts_note(pods, args.attempt)
    if note:
        print(f"ddpjob logs: {note}", file=err)
    if args.follow and len(pods) > job_logs.MAX_FOLLOWED_PODS:
        return fail(f"-f follows at most {job_logs.MAX_FOLLOWED_PODS} pods at once and the job has {len(pods)}: "
                    "choose one with --rank", EXIT_INVALID)
    readers = [_PodReader(conn, args, pod) for pod in pods]
    try:
        if args.follow:
            printed = _follow(readers, args.attempt, out)
        else:  # a connection per pod at a time: a big gang's logs are merged a batch at a time
            batch = job_logs.MAX_FOLLOWED_PODS
            printed = sum(_merge(readers[i:i + batch], args.attempt, out) for i in range(0, len(readers), batch))
    except BrokenPipeError:  # `ddpjob logs JOB | head`: the reader has what it wanted
        if out is sys.stdout:  # and Python's own flush at exit would fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        for reader in readers:
            reader.close()
    failed = [r for r in readers if r.error]
    for reader in failed:
        print(f"ddpjob logs: node-{reader.pod.node_rank}: {reader.error}", file=err)
    if args.attempt is not None and not printed and not failed:
        print(f"ddpjob logs: no lines of attempt {args.attempt} in the logs of these pods", file=err)
    return EXIT_FAILED if failed else EXIT_OK


class _PodReader:
    """One pod's log as LogLines, read as it comes; an error is kept to be reported, once."""

    def __init__(self, conn: Any, args: argparse.Namespace, pod: NodePod):
        self.conn, self.args, self.pod = conn, args, pod
        self.error = ""
        self._stream: Any = None

    def lines(self) -> Iterator[LogLine]:
        from ddpjob.client import cluster

        try:
            anchor = self._anchor() if self.args.tail is not None else None
            self._stream = cluster.pod_log(self.conn, self.args.namespace, self.pod.name, names.CONTAINER_NAME,
                                           follow=self.args.follow, tail_lines=self.args.tail, timestamps=True)
            parser = PodLogParser(self.pod, at_log_start=self.args.tail is None, anchor=anchor,
                                  window=self.args.tail)
            splitter = LineSplitter()
            for chunk in _chunks(self._stream):
                for raw in splitter.feed(chunk):
                    time, text = split_timestamp(raw)
                    yield from parser.feed(text, time)
            for raw in splitter.finish():
                time, text = split_timestamp(raw)
                yield from parser.feed(text, time)
            yield from parser.finish()
        except cluster.ClusterError as error:
            self.error = cluster.hint(error, self.args.namespace, "pods/log")
        except Exception as error:  # a connection cut mid-read, a closed stream
            if self._stream is not None and not getattr(self._stream, "closed", False):
                self.error = f"reading the log of pod {self.pod.name} stopped: {type(error).__name__}: {error}"

    def _anchor(self) -> Optional[bytes]:
        """The log's first line (the entry point's mark), read apart from a --tail window."""
        from ddpjob.client import cluster

        stream = cluster.pod_log(self.conn, self.args.namespace, self.pod.name, names.CONTAINER_NAME,
                                 limit_bytes=ANCHOR_BYTES)
        try:
            head = stream.read(ANCHOR_BYTES)
        finally:
            stream.release_conn()
        return head.split(b"\n", 1)[0] if b"\n" in head else None

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:  # already closed by the other side
                pass


def _chunks(stream: Any) -> Iterator[bytes]:
    """The bytes as they arrive (one socket read each), not in full buffers: a followed log
    shows each line when it is written."""
    read = getattr(stream, "read1", None)
    if read is None:
        yield from stream.stream(CHUNK_BYTES)
        return
    while True:
        chunk = read(CHUNK_BYTES)
        if not chunk:
            return
        yield chunk


def _next_run(reader: _PodReader, stop: threading.Event) -> Optional[_PodReader]:
    """The reader of the node's next run, once it has started; None once the job is finished
    or gone, or ``stop`` is set (an API error ends the wait too: the node's log is then reported
    as it stopped)."""
    from ddpjob.client import cluster

    args = reader.args
    while True:
        try:
            job = cluster.get_job(reader.conn, args.namespace, args.job)
            listed = cluster.list_pods(reader.conn, args.namespace,
                                       f"{names.LABEL_JOB_NAME}={args.job},{names.LABEL_NODE_RANK}={reader.pod.node_rank}")
        except cluster.ClusterError as error:
            reader.error = cluster.hint(error, args.namespace, "pods")
            return None
        pod, waiting = job_logs.next_run(job, listed, reader.pod)
        if pod is not None:
            return _PodReader(reader.conn, argparse.Namespace(**{**vars(args), "tail": None}), pod)
        if not waiting or stop.wait(NEXT_RUN_POLL_SECONDS):
            return None


def _print(line: LogLine, attempt: Optional[int], out: TextIO) -> bool:
    if attempt is not None and line.attempt != attempt:
        return False
    text = format_line(line)
    point = progress_plot.point_of(line.text) if line.node_rank == 0 and not line.header else None
    if point is not None and _terminal(out):  # node 0's progress: a bar in front (issue 36, item 7)
        text = f"{progress_plot.bar(point.step, point.total)} {text}"
    out.write(text + "\n")
    return True


def _terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _merge(readers: list[_PodReader], attempt: Optional[int], out: TextIO) -> int:
    """Every pod's log in the kubelet's time order, one line of each held at a time."""
    printed = 0
    for line in heapq.merge(*(r.lines() for r in readers), key=lambda line: line.time):
        printed += _print(line, attempt, out)
    out.flush()
    return printed


#: How often a followed node whose log ended is looked for again (a recreated pod, a container
#: the kubelet restarted), while the job runs.
NEXT_RUN_POLL_SECONDS = 1.0


def _follow(readers: list[_PodReader], attempt: Optional[int], out: TextIO) -> int:
    """A thread per node; lines printed as they come, until the job is finished (or gone) and
    every log has ended, or Ctrl-C. A node whose log ends while the job runs is followed on into
    its next run: the pod recreated for it, or its container restarted in the pod."""
    lines: queue.Queue = queue.Queue(QUEUE_LINES)
    done = object()
    # Set when the printing ends (every log ended, Ctrl-C, a closed pipe): the readers then stop
    # too, rather than go on reading and asking the API server for a next run nobody prints.
    stop = threading.Event()

    def put(item: Any) -> None:
        while not stop.is_set():
            try:
                lines.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def read(reader: _PodReader) -> None:
        try:
            while not stop.is_set():
                # A container still being created has no log yet (the kubelet answers 400): its
                # node is waited for like a next run, not reported as unreadable.
                if reader.pod.started:
                    for line in reader.lines():
                        if stop.is_set():
                            return
                        put(line)
                    if reader.error:
                        return
                successor = _next_run(reader, stop)
                if successor is None:
                    return
                readers.append(successor)  # closed with the others
                reader = successor
        finally:
            put(done)

    first_runs = list(readers)  # a thread appends its node's next run to readers as it goes
    for reader in first_runs:
        threading.Thread(target=read, args=(reader,), daemon=True, name=f"log-{reader.pod.name}").start()
    printed, running = 0, len(first_runs)
    try:
        while running:
            try:
                line = lines.get(timeout=0.5)  # a timeout, so that Ctrl-C is seen at once
            except queue.Empty:
                continue
            if line is done:
                running -= 1
                continue
            printed += _print(line, attempt, out)
            if lines.empty():
                out.flush()
    finally:
        stop.set()
    return printed
