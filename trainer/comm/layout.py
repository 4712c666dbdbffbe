"""DDP's bucket layout settled before the first real step (the built-in trainers' setup)."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..torchstate import autocast, fork_rng
from .hooks import TimedCommHook


def settle_layout(forward: torch.nn.Module, ddp: DDP, meter: TimedCommHook,
                  batch_size: int, seq_len: int) -> None:
    """One step that changes nothing and sends no gradient, so DDP settles its bucket layout.

    DDP rebuilds buckets in gradient-ready order after its first step. Doing that here means
    every real step, including the first after a restart or a rejoin, sees the same layout,
    which PowerSGD's per-bucket error feedback and a live replica group's peers depend on.
    """
    device = meter.clock.device
    x = torch.zeros(batch_size, seq_len, dtype=torch.long, device=device)
    meter.passthrough = True
    with fork_rng(device):
        with autocast(device):
            _, loss = forward(x, x)
        loss.backward()
    ddp.zero_grad(set_to_none=True)
    meter.passthrough = False
