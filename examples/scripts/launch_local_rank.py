"""A DDP script from the torch.distributed.launch era, unchanged: argparse --local_rank without
a default, env:// init, the device from args.local_rank.

It was started as ``python -m torch.distributed.launch --nproc_per_node=N train.py``, which
passed ``--local_rank=<i>`` to each process. DDPJob does the same with ``localRankFlag:
--local_rank`` (examples/ddpjob-launch-local-rank.yaml, docs/launch-styles.md); without it
``args.local_rank`` would be None. Prints ``rank R/W local_rank L ok`` when DDP kept the
parameters equal on every rank.
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    torch.set_num_threads(1)
    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)
        device, backend = torch.device("cuda", args.local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(device)
    ddp = DistributedDataParallel(model, device_ids=[args.local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(16, 8, generator=data).to(device)
        loss = (ddp(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lowest, highest = params.clone(), params.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    assert torch.allclose(lowest, highest), "parameters differ across ranks"
    print(f"rank {rank}/{world} local_rank {args.local_rank} ok", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
