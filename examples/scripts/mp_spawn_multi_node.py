"""mp_spawn_single_node.py converted for several nodes (docs/launch-styles.md shows the diff).

Still mp.spawn (``launcher: spawn``: the pod entry point starts this script once per pod), but
the master, the world and the ranks now come from the environment DDPJob sets: MASTER_ADDR and
MASTER_PORT, WORLD_SIZE (every process of the job), RANK (the global rank of this pod's first
process) and LOCAL_WORLD_SIZE (the processes of this pod: nprocPerNode).
"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def setup(rank, world_size):
    # MASTER_ADDR and MASTER_PORT come from DDPJob (node 0 of the job).
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def train(local_rank, world_size, first_rank):
    rank = first_rank + local_rank
    setup(rank, world_size)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = 0
    for x, y in DataLoader(dataset, batch_size=8, sampler=sampler):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        seen += len(x)
    total = torch.tensor([seen])
    dist.all_reduce(total)
    print(f"rank {rank}/{world_size} ok: {seen} samples here, {total.item()} in all", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(os.environ["WORLD_SIZE"])
    first_rank = int(os.environ["RANK"])
    nprocs = int(os.environ["LOCAL_WORLD_SIZE"])
    mp.spawn(train, args=(world_size, first_rank), nprocs=nprocs, join=True)
