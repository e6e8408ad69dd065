"""A two-file project for `ddpjob submit` (train.py imports helper.py), shared by the tiers:
each process checks the world (ranks all-reduce to 0+1+...+(n-1)) and prints
``rank R/N ok steps=S``."""
from __future__ import annotations

from pathlib import Path

TRAIN = '''\
import argparse

import torch
import torch.distributed as dist

from helper import check_world

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1)
args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
check_world()
print(f"rank {dist.get_rank()}/{dist.get_world_size()} ok steps={args.steps}", flush=True)
dist.barrier()
dist.destroy_process_group()
'''
HELPER = '''\
import torch
import torch.distributed as dist


def check_world():
    ranks = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(ranks)
    world = dist.get_world_size()
    assert ranks.item() == world * (world - 1) / 2, "the ranks are not 0..world-1"
'''


def write_project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(TRAIN)
    (folder / "helper.py").write_text(HELPER)
    return folder
