"""A plain env:// script in the style of Kubeflow's PyTorchJob MNIST example, unchanged: it
reads only WORLD_SIZE (and the RANK that init_process_group reads itself), calls
``init_process_group(backend=args.backend)`` and trains; no LOCAL_RANK, no launcher.

As a DDPJob with ``nprocPerNode: 2`` it runs through the pod entry point (``args: [--script,
PATH]``), which starts it twice per pod, each with its own RANK and LOCAL_RANK
(examples/ddpjob-env-script.yaml). As a ``command`` of its own with ``nprocPerNode: 2`` it is
refused by ``ddpjob validate`` and the API server: it would start once per pod while
WORLD_SIZE counts two (docs/launch-styles.md). Synthetic data instead of MNIST: no download.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.flatten(1)))), dim=1)


def should_distribute():
    return dist.is_available() and WORLD_SIZE > 1


def is_distributed():
    return dist.is_available() and dist.is_initialized()


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST-style example")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--backend", type=str, default=dist.Backend.GLOO,
                        choices=[dist.Backend.GLOO, dist.Backend.NCCL, dist.Backend.MPI])
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)

    if should_distribute():
        print("Using distributed PyTorch with {} backend".format(args.backend), flush=True)
        dist.init_process_group(backend=args.backend)

    model = Net()
    if is_distributed():
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    for epoch in range(1, args.epochs + 1):
        for start in range(0, len(images), 16):
            optimizer.zero_grad()
            loss = F.nll_loss(model(images[start:start + 16]), labels[start:start + 16])
            loss.backward()
            optimizer.step()
        print("Train Epoch: {} loss={:.4f}".format(epoch, loss.item()), flush=True)

    if is_distributed():
        ranks = torch.tensor([dist.get_rank()])
        dist.all_reduce(ranks)
        world = dist.get_world_size()
        assert ranks.item() == world * (world - 1) // 2, "ranks are not 0..world-1"
        print(f"rank {dist.get_rank()}/{world} ok", flush=True)
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
