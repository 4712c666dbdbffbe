"""comm=auto under `fault_tolerance = "live"`: one hook for every replica group, decided once at
the run's first quorum and carried to a group that joins later (docs/ARCHITECTURE.md, "Live
fault tolerance").

Every group measures its compute, each hook's own cost and the link between the groups (timed
all-reduces through torchft's Manager, which is what the hook will use); the numbers are then
averaged over the groups with the same all-reduce, so each applies comm=auto's model
(`comm.autocomm`) to equal inputs and takes the same hook. The candidates are the hooks whose
state is the gradient alone (none, bf16): PowerSGD's per-replica state is not something a
joining group can be handed mid-step, so it runs under live only when named.

A group that joins later does not know the hook before its first step: every group sends plain
float32 in a step where a group is healing (`healing_in_quorum`), and the hook comes with the
live state the joining group is sent (`comm` in the state dict), as it does with a checkpoint.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ..bandwidth import busbw_gbs
from .commsetup import Measured, decide_from, measure_compute
from .decision import CommDecision, LinkEstimate
from .hookcost import measure_hook_costs

# fp16 is left out: a group on bf16 and one on fp16 would send the same bytes and sum garbage;
# none against bf16 fails the all-reduce instead (sizes differ), and the step is not committed.
AUTO_LIVE_HOOKS = ("none", "bf16")
_LATENCY_BYTES = 4 << 10
_BANDWIDTH_BYTES = 16 << 20
_ITERS = 3


def replicas_in_quorum(manager) -> int:
    """Replica groups in this step's quorum, healing ones included (torchft 0.2.0 configures its
    process group with them; num_participants() leaves the healing ones out)."""
    return manager._pg.size()


def healing_in_quorum(manager) -> bool:
    """Whether a group in this step's quorum is healing: it does not know the hook yet, so every
    group sends plain float32 in this step (`TimedCommHook.plain_while`).

    The quorum is waited for first (num_participants does), since the process group is being
    configured until then. A quorum that failed (to configure the group, or to heal) leaves the
    Manager errored, its process group possibly unset and the step uncommitted: plain float32,
    the wire every group can sum, is sent."""
    participants = manager.num_participants()
    if manager.errored():
        return True
    return replicas_in_quorum(manager) > participants


def _timed(manager, nbytes: int, device: torch.device) -> float:
    """Mean seconds of one float32 all-reduce of `nbytes` through the Manager."""
    tensor = torch.ones(max(1, nbytes // 4), device=device)
    manager.allreduce(tensor).wait()  # warm-up
    start = time.perf_counter()
    for _ in range(_ITERS):
        manager.allreduce(tensor).wait()
    return (time.perf_counter() - start) / _ITERS


def probe_replicas(manager, grad_bytes: int, device: torch.device) -> tuple[float, float]:
    """(busbw Gbit/s, latency s) between the replica groups, as this group saw them."""
    latency = _timed(manager, _LATENCY_BYTES, device)
    size = max(_LATENCY_BYTES, min(_BANDWIDTH_BYTES, grad_bytes))
    seconds = _timed(manager, size, device)
    groups = max(2, manager.num_participants())
    return busbw_gbs(size, seconds, groups) * 8, latency


def decide_live_comm(cfg, env, model: torch.nn.Module, manager) -> CommDecision:
    """Collective over the quorum (call after the first quorum, before the first step)."""
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    compute_s = measure_compute(model, cfg, env.device)
    hook_s = measure_hook_costs(model, AUTO_LIVE_HOOKS, cfg.powersgd_rank, env.device)
    busbw, latency = probe_replicas(manager, grad_bytes, env.device)
    numbers = torch.tensor([compute_s, busbw, latency, *(hook_s.get(h, 0.0) for h in AUTO_LIVE_HOOKS)],
                           dtype=torch.float64, device=env.device)
    manager.allreduce(numbers).wait()  # the mean over the groups: equal inputs everywhere
    compute_s, busbw, latency, *costs = numbers.tolist()
    groups = max(1, manager.num_participants())
    link = LinkEstimate(busbw, latency, f"probe between {groups} replica groups")
    # The model's world is the replica groups: their all-reduce is what crosses the link.
    across = dataclasses.replace(env, world_size=max(2, groups))
    measured = Measured(link, compute_s, dict(zip(AUTO_LIVE_HOOKS, costs, strict=True)))
    return decide_from(cfg, across, model, measured, step=0, hooks=AUTO_LIVE_HOOKS)
