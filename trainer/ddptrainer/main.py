"""``ddptrain``: set up, build, train, clean up; one exit code per cause (ddpjob.contract).

Run it under torchrun (``torchrun --nproc-per-node 2 -m ddptrainer.main --model tiny-cnn``),
under the pod entry point ``ddptrain-pod``, or as a plain process (world size 1).
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.contract import ExitCode

from . import summary
from .config import TrainConfig, parse_config
from .data import build_dataset
from .distributed import setup, teardown
from .errors import (ConfigError, DataMissingError, DiskFullError, PeerLostError, Preempted,
                     TrainerError, is_collective_failure)
from .preemption import StopRequest
from .progress import Progress
from .startup import StartupTimes
from .text import env_int, first_line
from .train import Trainer, TrainResult

# Errors every rank hits identically (or gets from rank 0): one line per node is enough.
_SAME_ON_EVERY_RANK = (ConfigError, DataMissingError, DiskFullError)
# torchrun stops every worker at the first one's exit: the ranks that stay silent about such an
# error wait this long before exiting, so that local rank 0 gets to print it.
_SILENT_RANK_EXIT_DELAY_SECONDS = 1.0
# Set once this process has started a process group (main() then exits without teardown).
_process_group_started = False


def run(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    """Train; return the exit code. Never raises (except SystemExit for --help)."""
    startup = StartupTimes()  # the start line says where the start-up went (startup.py)
    env = os.environ if environ is None else environ
    rank = env_int(env, contract.RANK, invalid=None)
    local_rank = env_int(env, contract.LOCAL_RANK, invalid=None)
    config: Optional[TrainConfig] = None
    ctx = None
    code, text, skip_teardown = int(ExitCode.SUCCESS), "", False
    stop = StopRequest().install()
    try:
        config = parse_config(argv, env)
        ctx = setup(config, env)
        startup.mark("rendezvous")
        rank, local_rank = ctx.rank, ctx.local_rank
        if ctx.distributed:
            global _process_group_started
            _process_group_started = True
        progress = Progress(ctx.is_main, config.log_format)
        data = build_dataset(config, ctx)
        startup.mark("data")
        # Nothing here outlives run(): process groups (in ctx, in DDP) kept alive past
        # destroy_process_group() until interpreter exit can make gloo abort the process.
        trainer = Trainer(config, ctx, data, progress, stop)
        startup.mark("model_and_resume")
        result = trainer.run(startup=startup.fields())
        text = _report_done(progress, result, ctx.world_size)
    except Preempted as e:
        code, text = e.exit_code, f"preempted: {e.message}"
        if rank in (0, None):
            print(f"ddptrain: {text}", file=sys.stderr, flush=True)
    except TrainerError as e:
        code, text = e.exit_code, f"{e.kind}: {e.message}"
        same_on_every_rank = isinstance(e, _SAME_ON_EVERY_RANK) and getattr(e, "same_on_every_rank", True)
        if not same_on_every_rank or local_rank in (0, None):
            where = "" if same_on_every_rank or rank is None else f"rank {rank}: "
            print(f"ddptrain: error: {where}{e.message}", file=sys.stderr, flush=True)
        else:
            time.sleep(_SILENT_RANK_EXIT_DELAY_SECONDS)
    except KeyboardInterrupt:
        code, text = 130, "interrupted (SIGINT twice)"
    except Exception as e:  # noqa: BLE001 - the last line of defence picks the exit code
        if ctx is not None and ctx.distributed and is_collective_failure(e):
            lost = PeerLostError(f"rank {rank}: {first_line(e)}")
            code, text = lost.exit_code, f"{lost.kind}: {lost.message}"
            # A process group whose peer is gone can block in destroy (NCCL); exiting frees it.
            skip_teardown = True
            print(f"ddptrain: error: {text}", file=sys.stderr, flush=True)
        else:
            code, text = int(ExitCode.FAILURE), f"unexpected error: rank {rank}: {first_line(e)}"
            traceback.print_exc()
    finally:
        if not skip_teardown:
            teardown(ctx)
        stop.uninstall()
    _leave_summary(text, code, rank, config, env)
    return code


def _report_done(progress: Progress, result: TrainResult, world_size: int) -> str:
    """The last progress line; returns the termination message."""
    ev = result.evaluation
    accuracy = {} if ev is None else {"accuracy": round(ev.accuracy, 6),
                                      "eval_samples": ev.samples}
    progress.emit("done", step=result.step, total_steps=result.total_steps, loss=result.loss,
                  **accuracy, world_size=world_size,
                  elapsed_seconds=round(result.elapsed_seconds, 1), checkpoint=result.checkpoint)
    tested = "" if ev is None else (f" accuracy={ev.accuracy:.4f} ({ev.correct}/{ev.samples} "
                                    "test samples)")
    return (f"completed: step={result.step}/{result.total_steps} loss={_loss(result.loss)}"
            f"{tested} world_size={world_size} checkpoint={result.checkpoint}")


def _leave_summary(text: str, code: int, rank: Optional[int], config: Optional[TrainConfig],
                   env: Mapping[str, str]) -> None:
    if summary.leave_ending(code, text, rank or 0, env):
        return  # ddptrain-pod composes the pod's message from the workers'
    if (rank or 0) == 0 or code != 0:
        path, explicit = summary.resolve_termination_log(
            config.termination_log if config else None, env)
        summary.write_termination_message(f"ddptrain: {text}", path, explicit)


def _loss(loss: Optional[float]) -> str:
    return "n/a" if loss is None else f"{loss:.4f}"


def main(argv: Optional[Sequence[str]] = None) -> None:
    code = run(argv)
    if not _process_group_started:
        sys.exit(code)
    # Nothing is left to do but exit, and the exit code must stay the one run() chose. After a
    # failure the process group's C++ threads (gloo's) may still be winding down, and the
    # interpreter's teardown can then abort the process ("terminate called without an active
    # exception", SIGABRT), turning exit 4 (disk full) into 134 (retryable): flush and leave
    # without that teardown. Everything run() wrote (checkpoints, the summary) is closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
