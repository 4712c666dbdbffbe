"""The trainer's comm hook choice at setup: --comm as given, the checkpoint's, or comm=auto's.

comm=auto measures one step's compute here and takes the link from netcheck.json (else a short
probe); `autocomm` holds the model that turns those numbers into a hook.
"""

from __future__ import annotations

import logging
import math
import time

import torch

from .allreduce import slowest, sync
from .autocomm import (
    CommDecision,
    GradTraffic,
    choose_comm,
    powersgd_wire_elements,
    probe_link,
    read_netcheck,
)
from .bandwidth import MiB
from .collectives import broadcast_object
from .config import HOOK_NAMES, TrainConfig
from .distenv import DistEnv
from .hooks import powersgd_available
from .torchstate import autocast, fork_rng

log = logging.getLogger(__name__)


def decide_comm(cfg: TrainConfig, env: DistEnv, model: torch.nn.Module, grad_bytes: int,
                ckpt: dict | None) -> dict:
    """The comm decision (CommDecision.to_dict()), the same on every rank."""
    if cfg.comm == "powersgd" and not powersgd_available():
        raise RuntimeError("comm=powersgd needs numpy (torch's PowerSGD uses it): "
                           "pip install numpy, or pick another --comm")
    if cfg.comm != "auto":
        return CommDecision(cfg.comm, "set by --comm", world_size=env.world_size).to_dict()
    if ckpt and ckpt.get("comm_decision"):
        # A resumed run keeps its hook: switching would change the numbers mid-run.
        log.info("comm=auto: keeping %s from the checkpoint", ckpt["comm_decision"]["comm"])
        return ckpt["comm_decision"]
    if env.world_size == 1:
        return CommDecision("none", "single process, nothing to send").to_dict()
    compute_s = measure_compute(model, cfg, env.device)
    # netcheck.json may exist on rank 0's disk only.
    link = broadcast_object(read_netcheck(cfg.out_dir) if env.is_main else None, 0,
                            env.device) or probe_link(env.device, grad_bytes)
    shapes = [p.shape for p in model.parameters()]
    traffic = GradTraffic(
        grad_bytes, buckets=max(1, math.ceil(grad_bytes / (cfg.bucket_cap_mb * MiB))),
        powersgd_bytes=powersgd_wire_elements(shapes, cfg.powersgd_rank) * 4,
        powersgd_buckets=1 if env.backend == "gloo" else None)
    decision = choose_comm(
        link, compute_s, cfg.grad_accum, traffic, world_size=env.world_size,
        hooks=tuple(h for h in HOOK_NAMES if h != "powersgd" or powersgd_available()))
    if env.is_main:
        log.info("%s", decision.describe())
    return broadcast_object(decision.to_dict(), 0, env.device)  # one hook on every rank


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
