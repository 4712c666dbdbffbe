"""What each comm hook costs on this node by itself: torch's hook run against a one-rank group.

comm=auto prices a hook by its bytes on the wire (`costmodel`) plus this: the hook's own work
per step (bf16's casts, PowerSGD's matrix products, orthogonalisation and error feedback) timed
here on gradients of the model's real shapes, with every rank measuring at once (so a node's
ranks share its cores as they will in training) and the slowest rank's time kept. The group
has one rank, so its all-reduces move nothing: what remains is the hook.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from .allreduce import slowest, sync
from .hooks import make_powersgd_state

log = logging.getLogger(__name__)

WARMUP_CALLS = 2  # after PowerSGD's plain iterations: its first compressed calls allocate
TIMED_CALLS = 3

_solo_groups: dict[int, object] = {}


class _Bucket:
    """The part of dist.GradBucket that torch's Python hooks read (a GradBucket cannot be built
    outside DDP's reducer)."""

    def __init__(self, grads: list[torch.Tensor]):
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self._grads, offset = [], 0
        for g in grads:  # views into the flat buffer, as DDP's gradient_as_bucket_view gives
            self._grads.append(self._buffer[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer.copy_(tensor)


def solo_group():
    """A process group holding only this rank. Collective: every rank creates every rank's
    group, in the same order (torch's rule for new_group); made once per process."""
    if not _solo_groups:
        for r in range(dist.get_world_size()):
            _solo_groups[r] = dist.new_group([r])
    return _solo_groups[dist.get_rank()]


def _run(name: str, group, state, bucket: _Bucket) -> None:
    if name == "powersgd":
        fut = psgd.powerSGD_hook(state, bucket)
    elif name in ("bf16", "fp16"):
        hook = default_hooks.bf16_compress_hook if name == "bf16" else \
            default_hooks.fp16_compress_hook
        fut = hook(group, bucket)
    else:
        fut = default_hooks.allreduce_hook(group, bucket)
    fut.wait()


def measure_hook_costs(model: torch.nn.Module, hooks: tuple[str, ...], powersgd_rank: int,
                       device: torch.device) -> dict[str, float]:
    """Seconds per step of each hook's own work, slowest rank; collective (same `hooks` on all)."""
    group = solo_group()
    gen = torch.Generator(device=device).manual_seed(0)  # the trainer's RNG streams stay as they are
    grads = [torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype)
             for p in model.parameters() if p.requires_grad]
    costs = {}
    for name in hooks:
        state = None
        calls = WARMUP_CALLS + TIMED_CALLS
        if name == "powersgd":
            state = make_powersgd_state(powersgd_rank, 2, seed=0)
            state.process_group = group
            calls += state.start_powerSGD_iter  # its first calls send plain gradients
        times = []
        for _ in range(calls):
            bucket = _Bucket(grads)
            sync(device)
            start = time.perf_counter()
            _run(name, group, state, bucket)
            sync(device)
            times.append(time.perf_counter() - start)
        costs[name] = slowest(statistics.median(times[-TIMED_CALLS:]), device)
    log.debug("hook costs: %s", costs)
    return costs
