"""The distributed skeleton of pytorch/examples' imagenet/main.py, unchanged in its launch logic.

Its command line says everything explicitly: ``--dist-url tcp://ADDR:PORT --world-size NODES
--rank NODE --multiprocessing-distributed``; ``main()`` multiplies the world size by the GPUs per
node (1 on a machine without CUDA) and ``mp.spawn``s one ``main_worker`` per GPU, which computes
its global rank as ``rank * ngpus_per_node + gpu`` and calls ``init_process_group(init_method=
dist_url, world_size=..., rank=...)``. As a DDPJob (examples/ddpjob-imagenet-style.yaml):
``launcher: spawn``, ``nprocPerNode`` = the GPUs per pod (1 on CPU), and the args take the
job's values from the pod's environment: ``tcp://$(MASTER_ADDR):$(MASTER_PORT)``,
``--world-size $(NNODES)``, ``--rank $(PET_NODE_RANK)`` (docs/launch-styles.md, style 4).

Trimmed for a test: a small linear model on ``--dummy``-style random data instead of ResNet on
ImageNet, no validation or checkpoints; on CPU the model is wrapped in DDP too (the original
trains undistributed there). At the end every rank checks the world: the ranks all-reduce to
0+1+...+(n-1) and the parameters are equal on every rank.
"""
import argparse
import os
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (skeleton)")
parser.add_argument("--epochs", default=1, type=int, metavar="N")
parser.add_argument("-b", "--batch-size", default=16, type=int, metavar="N")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
parser.add_argument("--world-size", default=-1, type=int, help="number of nodes for distributed training")
parser.add_argument("--rank", default=-1, type=int, help="node rank for distributed training")
parser.add_argument("--dist-url", default="tcp://224.66.41.62:23456", type=str,
                    help="url used to set up distributed training")
parser.add_argument("--dist-backend", default="nccl", type=str, help="distributed backend")
parser.add_argument("--seed", default=None, type=int)
parser.add_argument("--gpu", default=None, type=int, help="GPU id to use.")
parser.add_argument("--multiprocessing-distributed", action="store_true",
                    help="Use multi-processing distributed training to launch N processes per node, "
                    "which has N GPUs.")
parser.add_argument("--dummy", action="store_true", help="use fake data to benchmark")


def main():
    args = parser.parse_args()
    if args.seed is not None:
        torch.manual_seed(args.seed)
    if args.dist_url == "env://" and args.world_size == -1:
        args.world_size = int(os.environ["WORLD_SIZE"])
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    if torch.cuda.is_available():
        ngpus_per_node = torch.cuda.device_count()
        if ngpus_per_node == 1 and args.dist_backend == "nccl":
            warnings.warn("nccl backend >=2.5 requires GPU count>1, see https://github.com/NVIDIA/nccl/issues/103 "
                          "perhaps use 'gloo'")
    else:
        ngpus_per_node = 1
    if args.multiprocessing_distributed:
        # Since we have ngpus_per_node processes per node, the total world_size
        # needs to be adjusted accordingly
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    torch.set_num_threads(1)
    if args.distributed:
        if args.dist_url == "env://" and args.rank == -1:
            args.rank = int(os.environ["RANK"])
        if args.multiprocessing_distributed:
            # For multiprocessing distributed training, rank needs to be the
            # global rank among all the processes
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Linear(32, 10)
    if torch.cuda.is_available() and args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model.cuda(args.gpu)
        # one GPU per process: the batch is split among the node's GPUs
        args.batch_size = int(args.batch_size / ngpus_per_node)
        model = DDP(model, device_ids=[args.gpu])
    elif args.distributed:
        model = DDP(model)
    device = next(model.parameters()).device
    optimizer = torch.optim.SGD(model.parameters(), args.lr)
    generator = torch.Generator().manual_seed(1)  # "--dummy": random data, the same everywhere
    dataset = TensorDataset(torch.randn(128, 32, generator=generator), torch.randint(0, 10, (128,), generator=generator))
    sampler = DistributedSampler(dataset) if args.distributed else None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler)
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for images, target in loader:
            images, target = images.to(device), target.to(device)
            loss = F.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"Epoch: [{epoch}] rank {args.rank} loss {loss.item():.4f}", flush=True)
    if args.distributed:
        check_world(model, args, len(sampler))
        dist.barrier()
        dist.destroy_process_group()


def check_world(model, args, samples_here):
    """Every rank of one world, and DDP kept their parameters equal."""
    world = dist.get_world_size()
    ranks = torch.tensor([float(dist.get_rank())], device=next(model.parameters()).device)
    dist.all_reduce(ranks)
    assert ranks.item() == world * (world - 1) / 2, "the ranks are not 0..world-1"
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = weights.clone()
    dist.all_reduce(gathered)
    assert torch.allclose(gathered / world, weights, atol=1e-6), "the ranks' parameters differ"
    print(f"rank {dist.get_rank()}/{world} ok: {samples_here} samples here", flush=True)


if __name__ == "__main__":
    main()
