"""Run a DDPJob on this machine, no cluster (the engine of `ddpjob run -f FILE`).

Each node of the job becomes a local process with the environment the operator gives its pod
(``contract.node_environment``, with MASTER_ADDR=127.0.0.1 and a free port), the spec's env and
its command + args. The gang is then treated as the operator treats pods: the first failing node
decides; a permanent exit code fails the job, a retryable one restarts the whole gang with the
next DDPJOB_RESTART_ATTEMPT until failurePolicy.maxRestarts is spent. The exit code is the job's
outcome: 0, the failing node's code, 128 + signal when stopped by Ctrl-C / SIGTERM, or 124 when
activeDeadlineSeconds passes. docs/local-run.md is the user's page.

What each node runs is worked out in ``plan``, volume mounts in ``volumes``, process handling in
``supervisor``; the file is read by ``ddpjob.api.loader`` (``ddpjob.cli.run``), the verdict after
a failure is ``ddpjob.api.failure_policy``'s, as in the operator. This module applies it and
prints. Like the rest of the package it never imports torch.
"""
from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.api import failure_policy
from ddpjob.api import goodput
from ddpjob.api import progress as progress_reports
from ddpjob.api import repeated_error
from ddpjob.api import spec as api
from ddpjob.local import in_place
from ddpjob.local.in_place import InPlaceGang
from ddpjob.local.plan import (LocalRunError, LocalSetup, NodeControl, check_gpus, job_environment,
                               node_command, process_environment, progress_dir, reserve_free_port,
                               termination_log_path, visible_gpu_ids)
from ddpjob.local.supervisor import Console, Gang, GangOutcome, NodeLaunch, StopRequest
from ddpjob.local.volumes import materialise_mounts

EXIT_BAD_INPUT = 2  # the same code `ddpjob validate` uses for a job that cannot run as written
EXIT_DEADLINE = 124  # timeout(1)'s convention for "stopped because time ran out"
EXIT_STALLED = 1  # a stalled gang has no exit code of its own; the budget spent: a plain failure


# ---------------------------------------------------------------------------------------------
# The failure policy: the operator's own (api.failure_policy), in `ddpjob run`'s words
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AfterGang:
    """What follows a gang's end: another attempt, or the run's exit code and last words."""

    restart: bool
    exit_code: int
    message: str


def restart_or_fail(outcome: GangOutcome, *, restarts_done: int, spec: api.DDPJobSpec,
                    job_name: str, error: str = "", errors_before: Sequence[str] = ()) -> AfterGang:
    """Given how the gang ended, restart it or end the run with which exit code and message.
    ``error``: the attempt's error where it can be a deterministic one (``early_error``);
    ``errors_before``: the earlier attempts', newest first."""
    if outcome.kind == "succeeded":
        after = f" after {restarts_done} restart{'s' * (restarts_done != 1)}" if restarts_done else ""
        return AfterGang(False, 0, f"job {job_name} succeeded: all {spec.nnodes} nodes exited 0{after}")
    if outcome.kind == "stopped":
        name = signal.Signals(outcome.signum).name
        return AfterGang(False, 128 + outcome.signum, f"{name}: stopped every node")
    if outcome.kind == "deadline":
        return AfterGang(False, EXIT_DEADLINE,
                        f"activeDeadlineSeconds ({spec.activeDeadlineSeconds}) passed: stopped every node")
    if outcome.kind == "stalled":
        ruling = failure_policy.verdict([failure_policy.NodeFailure(outcome.node_rank or 0, None, "Stalled")],
                                        restarts_done=restarts_done, policy=spec.failurePolicy)
        what = f"Stalled: {outcome.message}"
        if not ruling.restart:
            return AfterGang(False, EXIT_STALLED, f"{what}; the restart budget (maxRestarts "
                            f"{ruling.budget}) is spent; job {job_name} failed")
        return AfterGang(True, EXIT_STALLED, f"{what}; restarting the gang "
                        f"(restart {ruling.restarts_after}/{ruling.budget})")
    code = outcome.exit_code
    ruling = failure_policy.verdict([failure_policy.NodeFailure(outcome.node_rank, code)],
                                    restarts_done=restarts_done, policy=spec.failurePolicy)
    meaning = re.sub(r" \((retryable|permanent)\)$", "", contract.describe_exit_code(code))
    what = f"node {outcome.node_rank} exited {code}"
    if ruling.reason == failure_policy.PERMANENT:
        return AfterGang(False, code, f"{what} ({meaning}, permanent); job {job_name} failed")
    attempts = spec.failurePolicy.repeatedErrorAttempts
    if repeated_error.repeated(error, errors_before, attempts):
        said = repeated_error.words(error, attempts, restarts_done - attempts + 1)
        return AfterGang(False, code, f"{what} ({meaning}); {said}; a restart cannot fix this "
                        f"(failurePolicy.repeatedErrorAttempts: {attempts}); job {job_name} failed")
    if ruling.reason == failure_policy.BUDGET_SPENT:
        return AfterGang(False, code, f"{what} ({meaning}, retryable) but the restart budget "
                        f"(maxRestarts {ruling.budget}) is spent; job {job_name} failed")
    return AfterGang(True, code, f"{what} ({meaning}, retryable); restarting the gang "
                    f"(restart {ruling.restarts_after}/{ruling.budget})")


def early_error(outcome: GangOutcome, message: str, accounting: "RunAccounting", seconds: float) -> str:
    """The error a failed attempt names where it can be a deterministic one (as the operator's
    controller/policy/failure.early_error): an exit of the code's own before it trained."""
    if outcome.kind != "failed" or not repeated_error.counts(outcome.exit_code):
        return ""
    error = repeated_error.error_of(message)
    early = repeated_error.failed_before_training(reported=accounting.attempt_reported,
                                                  ever_reported=accounting.reported_before,
                                                  seconds_since_start=seconds)
    return error if early else ""


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------
def run_job(job: api.DDPJob, *, workdir: str = ".", configmaps: Mapping[str, Any] | None = None,
            dry_run: bool = False, environ: Mapping[str, str] | None = None,
            console: Console | None = None) -> int:
    """Run ``job`` here until it succeeds or fails; returns the exit code for `ddpjob run`."""
    environ = dict(os.environ if environ is None else environ)
    console = console or Console()
    workdir = os.path.abspath(workdir)
    spec = job.spec
    if spec.suspend:
        console.note(f"job {job.name} has suspend: true, so the operator would start no pods; nothing to run")
        return 0
    gpu_ids = check_gpus(spec, visible_gpu_ids(environ))
    for index, entry in enumerate(spec.env):
        if "valueFrom" in entry and "value" not in entry and entry["name"] not in environ:
            raise LocalRunError(
                f"spec.env[{index}] ({entry['name']}) uses valueFrom, which needs a cluster; for a local "
                f"run, export {entry['name']} before `ddpjob run` (it is then taken from your environment)")
    with tempfile.TemporaryDirectory(prefix=f"ddpjob-run-{job.name}-") as scratch:
        try:
            mounts = materialise_mounts(spec.volumeMounts, spec.template.spec.volumes, configmaps or {}, scratch)
        except (ValueError, KeyError, OSError) as error:
            raise LocalRunError(f"volumes: {error}") from None
        for mount in mounts:
            console.note(f"volume {mount.note}")
        setup = LocalSetup(scratch, tuple(mounts), tuple(gpu_ids) if gpu_ids is not None else None,
                           run_uid=f"local-{uuid.uuid4()}")
        if dry_run:
            print_dry_run(job, setup, workdir, environ)
            return 0
        console.note(f"job {job.name}: {spec.nnodes} nodes x {spec.nprocPerNode} process(es), device "
                     f"{spec.device}, in {workdir} (the image is not used: the nodes run this machine's programs)")
        return supervise(job, setup, workdir, environ, console)


def supervise(job: api.DDPJob, setup: LocalSetup, workdir: str, environ: Mapping[str, str],
              console: Console) -> int:
    spec = job.spec
    stop = StopRequest()
    restore_signals = stop.install()
    deadline = time.monotonic() + spec.activeDeadlineSeconds if spec.activeDeadlineSeconds else None
    accounting = RunAccounting()
    gang: Optional[Gang] = None
    nodes: Optional[InPlaceGang] = None
    directory = ""
    try:
        restarts_done = 0
        errors: list[str] = []  # each attempt's (early_error), newest first
        started = time.monotonic()
        while True:
            if gang is None and not stop.requested:
                gang, nodes, directory = _start_gang(job, setup, workdir, environ, console, stop, restarts_done)
            accounting.look(running=True)
            if gang is None:  # stopped between two attempts: start nothing
                outcome = GangOutcome("stopped", signum=stop.signum)
            else:
                failure = _in_place_failure(nodes) if nodes is not None else None
                outcome = gang.wait(deadline=deadline, failure=failure,
                                    watch=accounting.watching(directory, stall_watch(job, directory, restarts_done)))
            accounting.progress(directory)  # what the gang reported last
            message = ""
            if outcome.kind == "failed":
                message = _read_termination_message(termination_log_path(setup, outcome.node_rank))
                if message:
                    console.note(f"node {outcome.node_rank} termination message: {message}")
            error = early_error(outcome, message or outcome.message, accounting, time.monotonic() - started)
            decision = restart_or_fail(outcome, restarts_done=restarts_done, spec=spec, job_name=job.name,
                                       error=error, errors_before=errors)
            console.note(decision.message)
            if not decision.restart:
                if gang is not None:
                    gang.stop()
                console.note(f"goodput: {accounting.finish()}")
                return decision.exit_code
            restarts_done += 1
            errors.insert(0, error)
            started = time.monotonic()
            accounting.restarted(restarts_done)
            assert gang is not None
            if _restarted_in_place(outcome, nodes, restarts_done, directory, console):
                continue
            gang.stop()
            gang = None
    finally:
        if gang is not None:
            gang.stop()  # an exception (or a signal's KeyboardInterrupt) leaves nothing running
        restore_signals()


def _start_gang(job: api.DDPJob, setup: LocalSetup, workdir: str, environ: Mapping[str, str],
                console: Console, stop: StopRequest, attempt: int) -> tuple[Gang, Optional[InPlaceGang], str]:
    """Every node started for ``attempt``, with a fresh master port (the previous attempt's may
    linger in TIME_WAIT) and, for in-place restarts, fresh ports and tokens of their own."""
    spec = job.spec
    controls = in_place.new_controls(spec.nnodes) if in_place.applies(spec) else None
    nodes = InPlaceGang(controls, spec.failurePolicy.permanentExitCodes, first_attempt=attempt) if controls else None
    port_holder = reserve_free_port()
    try:
        launches = _launches(job, setup, environ, port_holder.getsockname()[1], attempt, controls)
        for rank in range(spec.nnodes):  # each attempt's pods start with an empty log
            _remove(termination_log_path(setup, rank))
        gang = Gang(cwd=workdir, grace_seconds=spec.template.spec.terminationGracePeriodSeconds,
                    stop=stop, console=console)
        gang.start(launches, before_launch=port_holder.close)
    finally:
        port_holder.close()
    return gang, nodes, progress_dir(setup, attempt)


def _in_place_failure(nodes: InPlaceGang) -> Callable[[], Optional[tuple[int, int, str]]]:
    def failure() -> Optional[tuple[int, int, str]]:
        seen = nodes.failure()
        return None if seen is None else (seen.node_rank, seen.exit_code, seen.message)
    return failure


def _restarted_in_place(outcome: GangOutcome, nodes: Optional[InPlaceGang], attempt: int,
                        directory: str, console: Console) -> bool:
    """Order every node to run ``attempt`` in the processes they are (a failure their entry
    points told, or a stall); False where that cannot be: the gang is then started anew."""
    if nodes is None or not (outcome.in_place or outcome.kind == "stalled"):
        return False
    if not nodes.order(attempt):
        console.note(f"a node did not take the order to run attempt {attempt} in place: "
                     "starting the gang anew")
        return False
    contract.clear_progress_reports(directory)  # the stopped attempt's would pass for the next one's
    console.note(f"every node runs attempt {attempt} in place (the same processes; the workers "
                 "start anew and resume from the newest checkpoint)")
    return True


class RunAccounting:
    """The run's goodput, counted as the operator counts a job's (``api.goodput``): each gang's
    start, its progress reports (read with the stall watch, every second), the restarts, the
    end. Starting here is the processes' start to their first report (no scheduling or pulls)."""

    def __init__(self, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> None:
        self.clock = clock
        self.figures: Optional[goodput.Goodput] = None
        self.restarts = 0
        self.reported = False
        self.attempt_reported = False  # this attempt's ranks have reported
        self.reported_before = False  # an earlier attempt's had

    def look(self, **seen: Any) -> None:
        moment = goodput.Moment(ever_reported=self.reported, restarts=self.restarts, **seen)
        self.figures = goodput.advance(self.figures, moment, self.clock())

    def progress(self, directory: str) -> None:
        """This attempt's reports: the furthest rank's step, once there is one."""
        reports = progress_reports.parse_answer({"ranks": contract.read_progress_reports(directory)}, self.clock())
        if reports:
            self.reported = self.attempt_reported = True
            self.look(running=True, step=max(r.step for r in reports.values()))

    def watching(self, directory: str, stall: Optional[Callable[[], Optional[tuple[int, str]]]]
                 ) -> Callable[[], Optional[tuple[int, str]]]:
        """The gang's watch: the reports counted, then the stall check (if the job has bounds)."""
        def watch() -> Optional[tuple[int, str]]:
            self.progress(directory)
            return stall() if stall is not None else None

        return watch

    def restarted(self, restarts: int) -> None:
        self.restarts = restarts
        self.reported_before, self.attempt_reported = self.reported, False
        self.look(restarting=True)

    def finish(self) -> str:
        self.look(finished=True)
        return self.figures.summary if self.figures is not None else ""


def stall_watch(job: api.DDPJob, directory: str, attempt: int,
                clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
                ) -> Optional[Callable[[], Optional[tuple[int, str]]]]:
    """The operator's hang detection (api.progress.stall) over this attempt's report files;
    None when the job sets no bound. The clock of the startup bound starts now (the nodes are
    about to start: locally there is no scheduling or image pull to wait for)."""
    policy = job.spec.failurePolicy
    if not (policy.progressTimeoutSeconds or policy.firstProgressTimeoutSeconds):
        return None
    started = clock()
    seen: list[Optional[progress_reports.GangProgress]] = [None]

    def check() -> Optional[tuple[int, str]]:
        now = clock()
        answer = progress_reports.parse_answer({"ranks": contract.read_progress_reports(directory)}, now)
        seen[0] = progress_reports.merge(seen[0], attempt, [answer])
        stalled, _ = progress_reports.stall(job, seen[0], started, now)
        return (stalled.suspect_node, stalled.message) if stalled is not None else None

    return check


def _launches(job: api.DDPJob, setup: LocalSetup, environ: Mapping[str, str], master_port: int,
              restart_attempt: int, controls: Optional[list[NodeControl]] = None) -> list[NodeLaunch]:
    launches = []
    for rank in range(job.spec.nnodes):
        job_env = job_environment(job, node_rank=rank, master_port=master_port,
                                  restart_attempt=restart_attempt, setup=setup, environ=environ,
                                  controls=controls)
        argv = node_command(job.spec, job_env, setup.mounts)
        launches.append(NodeLaunch(rank, argv, process_environment(job_env, environ)))
    return launches


def print_dry_run(job: api.DDPJob, setup: LocalSetup, workdir: str, environ: Mapping[str, str]) -> None:
    port_holder = reserve_free_port()
    port = port_holder.getsockname()[1]
    port_holder.close()
    from_environ = {e["name"] for e in job.spec.env if "valueFrom" in e and "value" not in e}
    print(f"# ddpjob run --dry-run: job {job.name}, {job.spec.nnodes} nodes. MASTER_PORT {port}, DDPJOB_UID and "
          f"the paths under {setup.scratch_dir} are examples: a run binds a fresh port for each attempt and makes "
          "its own uid and scratch directory. Only the job's variables are shown; each node also inherits this "
          "shell's environment (less PET_* and the names the job sets).")
    # In-place restarts: each node's port and token are made per run, as the master port is.
    controls = ([NodeControl(c.port, "<a token of each run>") for c in in_place.new_controls(job.spec.nnodes)]
                if in_place.applies(job.spec) else None)
    for rank in range(job.spec.nnodes):
        job_env = job_environment(job, node_rank=rank, master_port=port, restart_attempt=0,
                                  setup=setup, environ=environ, controls=controls)
        print(f"node {rank}:")
        print(f"  cwd: {workdir}")
        print(f"  command: {shlex.join(node_command(job.spec, job_env, setup.mounts))}")
        print("  env:")
        for name, value in job_env.items():
            shown = "<from your environment>" if name in from_environ else value  # may be a secret
            print(f"    {name}={shown}")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _read_termination_message(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return " ".join(file.read().split())[:500]
    except OSError:
        return ""
