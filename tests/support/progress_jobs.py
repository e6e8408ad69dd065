"""A tiny DDP program that reports progress and can hang, for the hang-detection tests.

It trains nothing: each step is one gloo all-reduce, then rank 0 records the step in a
checkpoint file (atomically) and every rank reports it (``ddptrainer.report``). On attempt 0,
rank 1 hangs where ``HANG`` says: ``step`` (at step ``HANG_AT``, so rank 0 blocks inside the
all-reduce, as a stuck collective does) or ``init`` (before ``init_process_group``, so the
rendezvous never completes). With ``FAIL_ON_ATTEMPT=N``, rank 0 of attempt N exits 1 before
its rendezvous (before any report). A later attempt resumes from the checkpoint and finishes.
With ``REPORT_BEFORE_IMPORT=1``, a later attempt reports the step it resumes at before it
imports torch: on a loaded machine the import alone can outlast a test's short first-report
bound, which is then meant for attempt 0's hang only.
"""
from __future__ import annotations

HANGING_SCRIPT = r'''
import datetime, os, sys, time
from ddptrainer.report import report_progress

steps, hang_at = int(os.environ.get("STEPS", "10")), int(os.environ.get("HANG_AT", "4"))
hang, ckpt = os.environ.get("HANG", "step"), os.environ["CKPT"]
attempt, rank = int(os.environ["DDPJOB_RESTART_ATTEMPT"]), int(os.environ["RANK"])
if attempt > 0 and os.environ.get("REPORT_BEFORE_IMPORT") == "1":
    report_progress(int(open(ckpt).read()) if os.path.exists(ckpt) else 0, steps, force=True)
import torch
import torch.distributed as dist
torch.set_num_threads(1)


def stuck_in_collective():  # the frame the operator's StalledStacks Event must name
    time.sleep(3600)


if attempt == 0 and rank == 1 and hang == "init":
    print("rank 1 hangs before init_process_group", flush=True)
    time.sleep(3600)
if attempt == int(os.environ.get("FAIL_ON_ATTEMPT", "-1")) and rank == 0:
    print(f"rank 0 fails attempt {attempt} before its rendezvous", flush=True)
    sys.exit(1)
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print(f"rank {rank} attempt {attempt} resumes at step {start}", flush=True)
report_progress(start, steps, force=True)
value = torch.zeros(1)
for step in range(start, steps):
    if attempt == 0 and rank == 1 and hang == "step" and step == hang_at:
        print(f"rank 1 hangs at step {step}", flush=True)
        stuck_in_collective()
    dist.all_reduce(value)
    if rank == 0:
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(ckpt + ".tmp", ckpt)
    report_progress(step + 1, steps, loss=1.0 / (step + 1), force=True)
    time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} finished at step {steps}", flush=True)
'''
