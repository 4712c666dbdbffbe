"""All-reduce bandwidth measurement in the manner of nccl-tests: time, algbw and busbw.

busbw = algbw x 2(n-1)/n is the rate each link must carry in a ring all-reduce, so it is
comparable with the link's line rate whatever the number of ranks. The time reported is the
slowest rank's, and every rank runs the same sizes and iteration counts (gloo fails otherwise).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class AllReduceResult:
    size_bytes: int
    count: int  # float32 elements
    time_s: float  # mean time of one all-reduce on the slowest rank
    algbw_gbps: float  # size / time, in Gbit/s
    busbw_gbps: float  # algbw x 2(n-1)/n, in Gbit/s

    def to_dict(self) -> dict:
        return asdict(self)


def bus_factor(world_size: int) -> float:
    """Bytes each rank sends per byte reduced, in a ring all-reduce: 2(n-1)/n."""
    return 2 * (world_size - 1) / world_size if world_size > 1 else 0.0


def measure_allreduce(size_bytes: int, iters: int, warmup: int, device: torch.device,
                      group: dist.ProcessGroup | None = None) -> AllReduceResult:
    """Time `iters` float32 all-reduces of `size_bytes`, after `warmup` untimed ones."""
    count = max(1, size_bytes // 4)
    buf = torch.ones(count, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf, group=group)
    _sync(device)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf, group=group)
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64,
                           device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    t = float(elapsed.item())
    algbw = count * 4 * 8 / t / 1e9
    return AllReduceResult(count * 4, count, t, algbw,
                           algbw * bus_factor(dist.get_world_size(group)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
