"""Timed all-reduces in the manner of nccl-tests, shared by netbench, the comm=auto probe and
the trainer's compute measurement.

The time reported is the slowest rank's (every rank's time is all-reduced with MAX), and every
rank runs the same sizes and iteration counts (gloo fails otherwise). busbw = algbw x 2(n-1)/n
is the rate each link must carry in a ring all-reduce, so it is comparable with the link's
line rate whatever the number of ranks; the arithmetic is in `bandwidth` (torch-free).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..bandwidth import busbw_gbs
from ..faults import ISSUED


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(device: torch.device) -> None:
    ISSUED.add()
    if device.type == "cuda":  # NCCL: name the device, or it guesses (and warns)
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def slowest(seconds: float, device: torch.device) -> float:
    """The largest of every rank's `seconds`."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    ISSUED.add()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def timed_allreduce(tensor: torch.Tensor, warmup: int, iters: int, device: torch.device,
                    group=None) -> float:
    """Mean seconds of one in-place all-reduce of `tensor` over `group` (None: the world) on the
    slowest rank of the world; every rank calls it, each on its own group."""
    ISSUED.add(warmup + iters)
    for _ in range(warmup):
        dist.all_reduce(tensor, group=group)
    sync(device)
    barrier(device)  # every rank starts the clock together
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    sync(device)
    return slowest((time.perf_counter() - start) / iters, device)


@dataclass(frozen=True)
class AllReduceResult:
    time_s: float  # mean time of one all-reduce on the slowest rank
    busbw_gbps: float  # algbw x 2(n-1)/n, in Gbit/s


def measure_allreduce(size_bytes: int, iters: int, warmup: int,
                      device: torch.device, group=None) -> AllReduceResult:
    """Time `iters` float32 all-reduces of `size_bytes` over `group` (None: the world), after
    `warmup` untimed ones."""
    count = max(1, size_bytes // 4)
    buf = torch.ones(count, dtype=torch.float32, device=device)
    t = timed_allreduce(buf, warmup, iters, device, group)
    return AllReduceResult(t, busbw_gbs(count * 4, t, dist.get_world_size(group)) * 8)
