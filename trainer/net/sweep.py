"""netbench's all-reduce measurements: sanity sum, small-message latency and the size sweep.

Needs an initialised process group. torch and the trainer's allreduce module are loaded
when a `Bench` is made and used (`trainer.lazy`), so netbench stays importable without torch.
"""

from __future__ import annotations

from ..bandwidth import DTYPE_BYTES, LATENCY_BYTES, format_table, iterations, sweep_row
from ..lazy import load


class Bench:
    """The process group and the device the measurements share."""

    def __init__(self, device):
        self.torch, self.dist, self.device = load("torch"), load("torch.distributed"), device
        self.rank, self.world_size = self.dist.get_rank(), self.dist.get_world_size()

    def barrier(self) -> None:
        load("fatpipe.trainer.comm.allreduce").barrier(self.device)

    def timed(self, tensor, warmup: int, iters: int) -> float:
        """Mean seconds of one in-place all-reduce of `tensor` on the slowest rank."""
        return load("fatpipe.trainer.comm.allreduce").timed_allreduce(tensor, warmup, iters, self.device)

    def check_sum(self) -> None:
        """One all-reduce of ones must give world_size everywhere, or the numbers mean nothing."""
        t = self.torch.ones(1024, dtype=self.torch.float32, device=self.device)
        self.dist.all_reduce(t)
        if not bool((t == self.world_size).all()):
            raise RuntimeError(f"all-reduce of ones gave {t[0].item()}, expected {self.world_size}")

    def latency(self, warmup: int = 20, iters: int = 200) -> float:
        t = self.torch.zeros(LATENCY_BYTES // DTYPE_BYTES, dtype=self.torch.float32, device=self.device)
        return self.timed(t, warmup, iters)

    def sweep(self, sizes: list[int], quick: bool = False, log=None) -> list[dict]:
        rows = []
        for size in sizes:
            warmup, iters = iterations(size, quick)
            # Zeros stay zeros under repeated sums: no overflow, and float speed does not
            # depend on the values for sums (no denormals).
            t = self.torch.zeros(size // DTYPE_BYTES, dtype=self.torch.float32, device=self.device)
            rows.append(sweep_row(size, self.timed(t, warmup, iters), self.world_size, warmup, iters))
            del t
            if log:
                log(format_table(rows[-1:]).splitlines()[-1])
        return rows
