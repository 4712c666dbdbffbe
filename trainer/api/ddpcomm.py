"""The run's comm choice on a DDP model: the one timed comm hook (`comm.hooks`) registered, the
chosen hook in it, and the bucket layout PowerSGD needs on gloo. The built-in trainer and a
user's script (`wrap`, `attach`) both go through here.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..bandwidth import MiB
from ..comm.decision import CommDecision
from ..comm.hooks import TimedCommHook, load_powersgd_state, make_powersgd_state
from ..config import HOOK_NAMES, TrainConfig
from ..live.powersgd import LivePowerSGD


def one_bucket_cap_mb(model: torch.nn.Module) -> float:
    """A bucket_cap_mb that puts every gradient in one DDP bucket.

    powerSGD_hook issues its P and Q all-reduces from future callbacks; on gloo two buckets'
    callbacks interleave differently on each rank ("collective mismatch" at the first
    compressed step). One bucket keeps the order fixed.
    """
    return grad_bytes(model) / MiB + 1


def grad_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def register_timed_hook(ddp: DDP, device: torch.device) -> TimedCommHook:
    """DDP's comm hook: a `TimedCommHook`, sending with plain all-reduce until `use_comm`."""
    meter = TimedCommHook(device)
    ddp.register_comm_hook(None, meter.hook)
    return meter


def use_comm(meter: TimedCommHook, cfg: TrainConfig, decision: CommDecision,
             saved_powersgd: dict | None = None) -> None:
    """Put the decided hook into `meter`; a periodic method's comm sends nothing per step.

    PowerSGD's warm-up counts from when it took over (`since_step`), so a switch and its resume
    agree; `saved_powersgd` is this rank's error feedback from a checkpoint. Under live (the
    meter's `across` set) its all-reduces go through the replica group's Manager and its state
    follows the quorum's (`live.powersgd`).
    """
    comm = decision.comm
    state = None
    if comm == "powersgd":
        state = make_powersgd_state(cfg.powersgd_rank, cfg.warmup_steps - decision.since_step,
                                    cfg.seed)
        if saved_powersgd:
            load_powersgd_state(state, saved_powersgd, meter.clock.device)
        state.process_group = meter.group  # across regions: the region's
    meter.use(comm if comm in HOOK_NAMES else "none", state)
    if state is not None and meter.across is not None:
        meter.keeper = LivePowerSGD(meter.across.manager, state, cfg.seed)
