"""A single-machine mp.spawn DDP script, unchanged (the PyTorch DDP tutorial's style).

It picks its own master (``MASTER_ADDR=localhost``, a free port found by binding), spawns
``world_size`` processes and passes ``rank=i, world_size=n`` to init_process_group and to its
DistributedSampler. As a DDPJob it runs unmodified on one node (``nnodes: 1``, ``launcher:
spawn``, examples/ddpjob-mp-spawn.yaml). On several nodes every pod would train alone: the pod
entry point's init guard refuses it at once (exit 2) with the lines to change;
mp_spawn_multi_node.py is the converted script (docs/launch-styles.md).
"""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def find_free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def train(rank, world_size, port):
    setup(rank, world_size, port)
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
    world_size = 2
    port = find_free_port()
    mp.spawn(train, args=(world_size, port), nprocs=world_size, join=True)
