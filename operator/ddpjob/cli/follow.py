"""`ddpjob submit --follow`: after the job is created, its logs until it ends, and its result
as the exit code (``job_wait``'s codes), as `torchx run`, `sky launch` and `ray job submit` do.

Until every node's pod is there, the job's status line is printed whenever it changes (a queue,
an image the nodes cannot pull: the reason and what to do). Then every node's log, merged, as
`ddpjob logs -f` prints it (a node whose container is still being created is waited for). A
log that cannot be read (a cluster whose kubelets do not serve logs to you) is said once, and
the wait for the result goes on: the exit code is the job's.
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable, Optional, TextIO

from ddpjob.api import names
from ddpjob.api.status import JobStatus
from ddpjob.client import job_logs, job_wait


def follow(conn: Any, args: argparse.Namespace, name: str, out: TextIO, err: TextIO,
           sleep: Optional[Callable[[float], None]] = None) -> int:
    from ddpjob.cli import logs, wait
    from ddpjob.client import cluster

    sleep = sleep or time.sleep
    namespace = args.namespace
    said = ""
    try:
        while True:  # a pod for every node, or the end
            job = cluster.get_job(conn, namespace, name)
            outcome = job_wait.judge(job, "finished")
            if outcome is not None:
                return wait.report(outcome, _named(args, name), out, err)
            status = JobStatus.from_dict((job or {}).get("status") or {})
            line = f"{status.phase or 'created'}" + (f" ({status.reason})" if status.reason else "") + \
                   (f": {status.message}" if status.message else "")
            if line != said:
                from ddpjob.client.terminal_text import one_line

                print(f"ddpjob submit: {name}: {one_line(line, 400)}", file=err)
                said = line
            if _every_node_has_a_pod(job, cluster.list_pods(conn, namespace, f"{names.LABEL_JOB_NAME}={name}")):
                break
            sleep(job_wait.POLL_SECONDS)
        log_args = argparse.Namespace(job=name, namespace=namespace, kubeconfig=args.kubeconfig,
                                      context=args.context, follow=True, rank=None, attempt=None, tail=None)
        if logs.run_logs(log_args, out, err) != logs.EXIT_OK:
            print("ddpjob submit: the logs cannot be followed; waiting for the job's result", file=err)
        outcome = job_wait.wait(lambda: cluster.get_job(conn, namespace, name), "finished", 0, sleep=sleep)
    except cluster.ClusterError as error:
        print(f"ddpjob submit: error: {cluster.hint(error, namespace, 'ddpjobs')}", file=err)
        return job_wait.EXIT_UNREADABLE
    except KeyboardInterrupt:  # the job goes on: say how to find it again
        print(f"ddpjob submit: stopped following; the job goes on (ddpjob logs {name} -n {namespace} -f, "
              f"ddpjob wait {name} -n {namespace})", file=err)
        return job_wait.EXIT_INTERRUPTED
    return wait.report(outcome, _named(args, name), out, err)


def _every_node_has_a_pod(job: Optional[dict], listed: list) -> bool:
    """The job's own pods (job_logs.job_pods) cover its nodes: following earlier would leave
    out the nodes whose pods the operator had not created yet when the logs were listed."""
    if job is None:
        return False
    nnodes = ((job.get("spec") or {}).get("nnodes"))
    ranks = {pod.node_rank for pod in job_logs.job_pods(job, listed)}
    return bool(ranks) and len(ranks) >= (nnodes if isinstance(nnodes, int) and nnodes > 0 else 1)


def _named(args: argparse.Namespace, name: str) -> argparse.Namespace:
    return argparse.Namespace(job=name, namespace=args.namespace, output=None)
