"""comm=auto under `fault_tolerance = "live"`: one hook for every replica group, decided by the
groups in the run's first step and carried to a group that joins later (docs/ARCHITECTURE.md,
"Live fault tolerance").

Every group measures its compute and each hook's own cost (once, no network), and in each
attempt at step 1 the link between the groups (timed all-reduces through torchft's Manager,
which is what the hook will use); the numbers are then averaged over the groups with the same
all-reduce, so each applies comm=auto's model (`comm.costmodel`) to equal inputs and takes the
same hook. The candidates are the hooks whose state is the gradient alone (none, bf16):
PowerSGD's per-replica state is not something a joining group can be handed mid-step, so it
runs under live only when named.

Equal inputs are not enough: after a failed all-reduce torchft hands each group its own numbers
back (a node lost in the probe, a quorum where one group is in its step while the others probe),
and groups on different hooks never commit a step. So the groups then vote on the hook itself
(`agree`): it stands only where every group in the quorum voted for it and no all-reduce failed.
Otherwise the Manager is told before step 1's should_commit: step 1 fails on this group and on
every other (their all-reduce misses this group, which no longer takes part), and is taken again
at the next quorum, where every group decides again. Every attempt at step 1 decides, so every
group in a quorum runs the same collectives in the same order: a group sending its gradient while
another probes would pair all-reduces of different sizes, which gloo answers by aborting the
process. No commit of its own: that would advance torchft's step.

A group that joins later does not know the hook before its first step: every group sends plain
float32 in a step where a group is healing (`healing_in_quorum`), and the hook comes with the
live state the joining group is sent (`comm` in the state dict), as it does with a checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import torch
from torch.distributed import ReduceOp

from ..bandwidth import busbw_gbs
from .allreduce import slowest
from .commsetup import Measured, decide_from, measure_compute
from .decision import CommDecision, LinkEstimate
from .hookcost import measure_hook_costs

# fp16 is left out: a group on bf16 and one on fp16 would send the same bytes and sum garbage;
# none against bf16 fails the all-reduce instead (sizes differ), and the step is not committed.
AUTO_LIVE_HOOKS = ("none", "bf16")
_LATENCY_BYTES = 4 << 10
_BANDWIDTH_BYTES = 16 << 20
_ITERS = 3
# Tests: seconds a group holds its probe open before the average (a node lost in the probe).
PROBE_PAUSE_ENV = "FATPIPE_TEST_PROBE_PAUSE_S"

log = logging.getLogger(__name__)


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


def measure_local(cfg, env, model: torch.nn.Module) -> tuple[float, dict[str, float]]:
    """Collective over the node's ranks: (compute seconds, each hook's own seconds), which do not
    depend on the network: measured once, before the first step."""
    return (measure_compute(model, cfg, env.device),
            measure_hook_costs(model, AUTO_LIVE_HOOKS, cfg.powersgd_rank, env.device))


def decide_live_comm(cfg, env, model: torch.nn.Module, manager,
                     local: tuple[float, dict[str, float]]) -> CommDecision:
    """Collective over the quorum and the node's ranks, in every attempt at step 1 (after its
    quorum, before the forward pass): the hook every group agreed on, or none with the Manager
    errored (`agree`). `local`: `measure_local`'s."""
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    compute_s, hook_s = local
    busbw, latency = probe_replicas(manager, grad_bytes, env.device)
    if os.environ.get(PROBE_PAUSE_ENV):
        log.warning("holding the probe open for %s s (%s)", os.environ[PROBE_PAUSE_ENV], PROBE_PAUSE_ENV)
        time.sleep(float(os.environ[PROBE_PAUSE_ENV]))
    numbers = torch.tensor([compute_s, busbw, latency, *(hook_s.get(h, 0.0) for h in AUTO_LIVE_HOOKS)],
                           dtype=torch.float64, device=env.device)
    manager.allreduce(numbers).wait()  # the mean over the groups: equal inputs everywhere
    if not everywhere(manager.errored() is None, env.device):  # this group's own numbers
        return disagreed(manager, env, "a measurement between the groups failed")
    compute_s, busbw, latency, *costs = numbers.tolist()
    groups = max(1, manager.num_participants())
    link = LinkEstimate(busbw, latency, f"probe between {groups} replica groups")
    # The model's world is the replica groups: their all-reduce is what crosses the link.
    across = dataclasses.replace(env, world_size=max(2, groups))
    measured = Measured(link, compute_s, dict(zip(AUTO_LIVE_HOOKS, costs, strict=True)))
    return agree(manager, env, decide_from(cfg, across, model, measured, step=0, hooks=AUTO_LIVE_HOOKS))


def everywhere(ok: bool, device: torch.device) -> bool:
    """Whether `ok` holds on every rank of the node (its ranks' Managers fail apart)."""
    return slowest(0.0 if ok else 1.0, device) == 0.0


def agree(manager, env, decision: CommDecision) -> CommDecision:
    """The groups' vote on `decision`'s hook: each sends a one-hot of its hook and a 1, summed
    over the quorum; the hook stands where it has every vote that was counted, as many as the
    groups taking part, with no all-reduce failed on any of the node's ranks."""
    vote = torch.zeros(len(AUTO_LIVE_HOOKS) + 1, dtype=torch.float64, device=env.device)
    mine = AUTO_LIVE_HOOKS.index(decision.comm) if decision.comm in AUTO_LIVE_HOOKS else None
    if mine is not None:
        vote[mine] = 1.0
    vote[-1] = 1.0
    manager.allreduce(vote, reduce_op=ReduceOp.SUM).wait()
    *hooks, voters = vote.tolist()
    agreed = (manager.errored() is None and mine is not None and hooks[mine] == voters
              and voters == manager.num_participants())
    if everywhere(agreed, env.device):
        return decision
    counted = ", ".join(f"{h} {int(n)}" for h, n in zip(AUTO_LIVE_HOOKS, hooks, strict=True))
    return disagreed(manager, env, f"the groups voted {counted} of {int(voters)}")


def disagreed(manager, env, why: str) -> CommDecision:
    """No agreed hook: the Manager is told, so step 1 fails on every group and every group
    decides again at the next quorum; the attempt sends none (nothing, once errored)."""
    if manager.errored() is None:
        manager.report_error(RuntimeError(f"comm=auto: no agreed hook ({why})"))
    if env.is_main:
        log.warning("comm=auto: no hook every replica group agreed on (%s): step 1 is not "
                    "committed, and every group decides again at the next quorum", why)
    return CommDecision("none", f"no hook every replica group agreed on ({why})")
