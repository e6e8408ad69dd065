"""A user's plain DDP script: one process per pod, no torchrun, nothing DDPJob-specific needed.

It relies only on what DDPJob puts on every pod for such scripts: MASTER_ADDR, MASTER_PORT,
WORLD_SIZE and RANK, which ``init_process_group(init_method="env://")`` reads, and LOCAL_RANK
(0, one process per pod). It trains a tiny model for a few steps on random data, checks that
DDP kept every rank's parameters equal and that an all-reduce adds up, and prints
``rank R/W ok``.

Run it with examples/ddpjob-plain-env.yaml (which ships this file in a ConfigMap):
``kubectl apply -f`` in a cluster, or ``ddpjob run -f examples/ddpjob-plain-env.yaml`` here.
The copy in that YAML must stay identical to this file (a unit test checks).
"""
import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 5


def wait_for_master_dns(host: str, timeout_seconds: float) -> None:
    """Wait until MASTER_ADDR resolves.

    In a cluster the master pod's DNS record can appear seconds after the other pods start,
    and a failed lookup is fatal to init_process_group (pytorch/pytorch#73682), whereas a
    refused connection is retried until the timeout. So wait for the name, not the port.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except socket.gaierror:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def main() -> int:
    torch.set_num_threads(1)  # several ranks may share one machine's cores
    if os.environ.get("LOCAL_WORLD_SIZE", "1") != "1":
        print("this script runs one process per pod: set nprocPerNode: 1", file=sys.stderr)
        return 2
    use_gpu = os.environ.get("DDPJOB_DEVICE", "cpu") == "gpu"
    if use_gpu and not torch.cuda.is_available():
        print("device gpu asked for, but CUDA is not available here", file=sys.stderr)
        return 2
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if use_gpu else torch.device("cpu")
    if use_gpu:
        torch.cuda.set_device(device)
    timeout = float(os.environ.get("DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS", "300"))
    wait_for_master_dns(os.environ["MASTER_ADDR"], timeout)
    dist.init_process_group(backend="nccl" if use_gpu else "gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        result = train_and_check(device)
        # Every rank reaches this point before any tears down: rank 0 hosts the rendezvous
        # store, and a gloo group destroyed while a peer still talks to it can abort.
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def train_and_check(device: torch.device) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of the data
    for _ in range(STEPS):
        inputs = torch.randn(32, 8, generator=data).to(device)
        targets = inputs.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp_model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    # DDP averages gradients, so every rank must end with the same parameters.
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lowest, highest = params.clone(), params.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    total = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(total)
    expected = world * (world + 1) / 2
    if not torch.allclose(lowest, highest) or total.item() != expected:
        print(f"rank {rank}/{world} FAILED: parameters differ across ranks or all-reduce sum "
              f"{total.item()} != {expected}", file=sys.stderr)
        return 1
    print(f"rank {rank}/{world} ok: loss {loss.item():.4f}, parameters agree, all-reduce sum {total.item():g}")
    return 0


if __name__ == "__main__":
    code = main()
    # With torch 2.14's gloo backend, DDP keeps the process group's worker threads alive until the
    # process ends, and one still releasing the last collective's tensors while the interpreter
    # shuts down aborts this finished run (SIGABRT, exit 134, "terminate called without an active
    # exception"), which DDPJob must count as a crash and restart. Everything is printed and
    # nothing is left to save: flush and leave without that shutdown. (Scripts started through
    # ddptrain-pod, such as the other examples, get the same protection from its init guard.)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
