"""The trainer's comm hook choice at setup: --comm as given, the checkpoint's, or comm=auto's.

comm=auto measures one step's compute and each hook's own cost here, and takes the link from
netcheck.json (else a short probe, `linkprobe`); `costmodel` holds the model that turns those
numbers into a hook. `redecide_comm` runs the same model again mid-run with a fresh link probe
(`redecide`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace

import torch

from ..bandwidth import MiB
from ..collectives import broadcast_object
from ..config import HOOK_NAMES, PERIODIC_NAMES, TrainConfig
from ..distenv import DistEnv
from ..torchstate import autocast, fork_rng
from .allreduce import slowest, sync
from .costmodel import GradTraffic, HookCost, choose_comm, powersgd_wire_elements
from .decision import CommDecision, DecisionUnreadable, LinkEstimate, read_decision
from .hookcost import measure_hook_costs
from .hooks import powersgd_available
from .linkprobe import probe_half_rates, probe_link, probe_size, read_netcheck

log = logging.getLogger(__name__)


def decide_comm(cfg: TrainConfig, env: DistEnv, model: torch.nn.Module, grad_bytes: int,
                ckpt: dict | None) -> CommDecision:
    """The comm decision, the same on every rank: --comm as named, else (comm=auto) the
    checkpoint's, else one measured now. A checkpoint without one decides anew (as a run from
    the start would); one this fatpipe cannot read is refused, since deciding anew could change
    the comm the checkpoint's per-rank state (error feedback, a periodic replica) was made for."""
    if cfg.comm == "powersgd" and not powersgd_available():
        raise RuntimeError("comm=powersgd needs numpy (torch's PowerSGD uses it): "
                           "pip install numpy, or pick another --comm")
    if cfg.comm != "auto":
        return CommDecision(cfg.comm, "set by --comm", world_size=env.world_size)
    if ckpt and ckpt.get("comm_decision"):
        # A resumed run keeps its checkpoint's hook, switched or not: what it would have done.
        try:
            kept = read_decision(ckpt["comm_decision"])
        except DecisionUnreadable as e:
            raise DecisionUnreadable(
                f"cannot resume step {ckpt.get('step')} with comm=auto: {e}; resume with the "
                f"comm it used named (--comm), or start a new run (another --out)") from None
        log.info("comm=auto: keeping %s from the checkpoint", kept.comm)
        return kept
    if env.world_size == 1:
        return CommDecision("none", "single process, nothing to send")
    compute_s = measure_compute(model, cfg, env.device)
    return decide_measured(cfg, env, model, compute_s)


def decide_measured(cfg: TrainConfig, env: DistEnv, model: torch.nn.Module, compute_s: float,
                    step: int = 0, hooks: tuple[str, ...] | None = None) -> CommDecision:
    """Collective: comm=auto's decision at `step` for a measured compute time (the built-in
    trainer measures its model's; a script using `trainer.api`, its own first steps): each
    hook's cost and the link (netcheck.json, else a short probe) are measured here."""
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    hook_s = measure_hook_costs(model, candidate_hooks(), cfg.powersgd_rank, env.device)
    # netcheck.json may exist on rank 0's disk only.
    link = broadcast_object(read_netcheck(cfg.out_dir) if env.is_main else None, 0,
                            env.device)
    if link:
        size = probe_size(env.device, grad_bytes)
        link = replace(link, half_rate=probe_half_rates(env.device, size))
    else:
        link = probe_link(env.device, grad_bytes)
    return decide_from(cfg, env, model, Measured(link, compute_s, hook_s), step=step, hooks=hooks)


@dataclass(frozen=True)
class Measured:
    link: LinkEstimate
    compute_s: float
    hook_s: dict


def candidate_hooks() -> tuple[str, ...]:
    return tuple(h for h in HOOK_NAMES if h != "powersgd" or powersgd_available())


def plain_steps(cfg: TrainConfig, step: int, current: CommDecision | None) -> int:
    """Steps PowerSGD would still send plain gradients for, counted from `step`.

    Its state compresses after max(2, warmup_steps - since_step) steps of its own (no compression
    during LR warmup; torch needs 2 with error feedback), `since_step` being when it took over.
    """
    if current and current.comm == "powersgd":
        since = current.since_step
        return max(0, max(2, cfg.warmup_steps - since) - (step - since))
    return max(2, cfg.warmup_steps - step)


def decide_from(cfg: TrainConfig, env: DistEnv, model: torch.nn.Module, m: Measured, step: int,
                current: CommDecision | None = None,
                hooks: tuple[str, ...] | None = None) -> CommDecision:
    """The model applied to measured numbers at `step`; the same record on every rank."""
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    shapes = [p.shape for p in model.parameters()]
    traffic = GradTraffic(
        grad_bytes, buckets=max(1, math.ceil(grad_bytes / (cfg.bucket_cap_mb * MiB))),
        powersgd_bytes=powersgd_wire_elements(shapes, cfg.powersgd_rank) * 4,
        powersgd_buckets=1 if env.backend == "gloo" else None)
    cost = HookCost(m.hook_s, {"powersgd": plain_steps(cfg, step, current)}, cfg.steps - step)
    decision = choose_comm(m.link, m.compute_s, cfg.grad_accum, traffic,
                           world_size=env.world_size, cost=cost,
                           # periodic.py: torch only; priced always, taken only when allowed
                           hooks=hooks or candidate_hooks() + PERIODIC_NAMES,
                           auto_periodic=cfg.auto_periodic)
    if env.is_main:
        log.info("%s", decision.describe())
    return broadcast_object(decision, 0, env.device)  # one hook on every rank


def redecide_comm(cfg: TrainConfig, env: DistEnv, model: torch.nn.Module,
                  current: CommDecision, step: int) -> CommDecision:
    """Collective: probe the link again and apply the model at `step`, keeping the compute and
    hook costs measured at setup (neither depends on the network). DDP hooks only: a periodic
    method's state is built at setup, not mid-run."""
    link = probe_link(env.device, current.grad_bytes)
    hook_s = {name: p.get("hook_s", 0.0) for name, p in current.predicted.items()}
    return decide_from(cfg, env, model, Measured(link, current.compute_s, hook_s), step, current,
                   hooks=candidate_hooks())


def measure_compute(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> float:
    """Seconds of forward + backward for one step, no communication (slowest rank)."""
    x = torch.zeros(cfg.batch_size, cfg.seq_len, dtype=torch.long, device=device)
    times = []
    with fork_rng(device):
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(cfg.grad_accum):
                with autocast(device):
                    _, loss = model(x, x)
                loss.backward()
            sync(device)
            times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    return slowest(min(times[1:]), device)
