"""Periodic synchronisation for slow links: comm = "localsgd" or "diloco".

On a slow link the gradient all-reduce of every step costs more than the step. These methods
send nothing for H optimizer steps (every backward runs under DDP's no_sync, so each replica
trains on its own shard), then synchronise once, after the optimizer step:

- localsgd: average the parameters with torch's PeriodicModelAverager (one all-reduce of the
  flattened parameters; gloo and NCCL alike).
- diloco: the outer step of DiLoCo (Douillard et al., 2023, arXiv:2311.08105). Every replica
  keeps the parameters of the last sync; the average of (those - its own) is a pseudo-gradient,
  applied to them by an outer SGD with Nesterov momentum (lr 0.7, momentum 0.9, the paper's);
  every replica continues from the result. The inner optimizer is the trainer's AdamW.

Both send the parameters' bytes once per H steps, and none of it overlaps compute. The last
step of a run always synchronises, so the replicas end identical.

torchft implements both too, through its Manager and quorum; fatpipe now runs that Manager for
`fault_tolerance = "live"` (trainer/live, docs/ARCHITECTURE.md, "Live fault tolerance"). These two
stay written here, with torch's optimizer and one all_reduce, because they must also run under
"restart" and on nodes without torchft's wheels (CPython 3.13, ARM), and torchft 0.2.0's DiLoCo
averages over the whole quorum with no second level (the regions issue needs one). Under "live"
they are refused for now: their sync across replica groups would have to go through the Manager.

Between syncs the replicas' parameters and AdamW moments differ, so a checkpoint keeps each
rank's own (`rank_state`) besides what they share (`shared_state`): resume is exact.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import (
    average_parameters_or_parameter_groups,
)

from ..config import PERIODIC_NAMES, TrainConfig
from ..distenv import DistEnv
from .allreduce import sync
from .decision import CommDecision
from .hooks import StepComm

log = logging.getLogger(__name__)

OUTER_LR = 0.7  # tuned for H near 500 (costmodel.MIN_AUTO_SYNC_EVERY)
OUTER_MOMENTUM = 0.9


class Periodic:
    """Train H steps locally, then synchronise; measures each step as TimedCommHook does."""

    # Whether the steps between syncs send nothing (every backward under DDP's no_sync). Across
    # regions DDP still syncs every step inside each region (`regiondiloco`).
    skips_step_sync = True

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 sync_every: int, total_steps: int, device: torch.device):
        self.model, self.optimizer, self.device = model, optimizer, device
        self.sync_every, self.total_steps = sync_every, total_steps
        self.param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self._comm = StepComm()

    def due(self, step: int) -> bool:
        return step % self.sync_every == 0 or step == self.total_steps

    def after_step(self, step: int) -> None:
        """Call after the optimizer step `step` (1-based): synchronise when one is due."""
        self._comm = StepComm(grad_bytes=self.param_bytes)
        if not self.due(step):
            self._advance(step)
            return
        sync(self.device)  # the step's compute is done: time the sync alone
        start = time.perf_counter()
        self._sync(step)
        sync(self.device)
        took = time.perf_counter() - start
        # Nothing hides a sync that runs after the optimizer step: all of it is exposed.
        self._comm = StepComm(took, took, self.param_bytes, self.param_bytes, 1)

    def end_step(self, inner: StepComm | None = None) -> StepComm:
        """The step's sync (`inner`: the per-step hook's, where steps sync too)."""
        return self._comm

    def _advance(self, step: int) -> None:
        """Bookkeeping of a step without a sync."""

    def _sync(self, step: int) -> None:
        raise NotImplementedError

    # ---- checkpoints: what every rank shares, and what is each rank's own ----------------------

    def shared_state(self) -> dict:
        return {}

    def rank_state(self) -> dict:
        """This replica's parameters and inner optimizer state (they differ between syncs)."""
        return {"params": [p.detach().cpu().clone() for p in self.model.parameters()],
                "optimizer": self.optimizer.state_dict()}

    def restore(self, shared: dict | None, mine: dict | None) -> None:
        if mine:
            with torch.no_grad():
                for p, saved in zip(self.model.parameters(), mine["params"], strict=True):
                    p.copy_(saved)
            self.optimizer.load_state_dict(mine["optimizer"])


class LocalSGD(Periodic):
    """Parameter averaging every H steps (torch's PeriodicModelAverager).

    Call after the optimizer step and before zero_grad: torch averages only the parameters
    that have a gradient (frozen ones never diverge).
    """

    def __init__(self, *args, start_step: int = 0):
        super().__init__(*args)
        # The averager counts its calls from 0 and averages at warmup_steps + k * period:
        # with warmup H - 1 and one call per step, that is after steps H, 2H, ... (1-based).
        self.averager = PeriodicModelAverager(period=self.sync_every,
                                              warmup_steps=self.sync_every - 1)
        self.averager.step = start_step  # its only state: the steps taken

    def _advance(self, step: int) -> None:
        self.averager.step = step - 1  # its count follows the run's (a script may pass its step)
        self.averager.average_parameters(self.model.parameters())  # counts; averages nothing

    def _sync(self, step: int) -> None:
        if step % self.sync_every == 0:
            self.averager.step = step - 1
            self.averager.average_parameters(self.model.parameters())
        else:  # the run's last step, off the period: average all the same, and count it
            average_parameters_or_parameter_groups(self.model.parameters(), dist.group.WORLD)
            self.averager.step += 1


class DiLoCo(Periodic):
    """DiLoCo's outer Nesterov step on the averaged pseudo-gradient every H steps."""

    def __init__(self, *args, start_step: int = 0):
        super().__init__(*args)
        # The parameters of the last sync (equal on every rank) and the outer optimizer on them.
        self.anchor = [p.detach().clone() for p in self.model.parameters()]
        self.outer = torch.optim.SGD(self.anchor, lr=OUTER_LR, momentum=OUTER_MOMENTUM,
                                     nesterov=True)

    @torch.no_grad()
    def _sync(self, step: int) -> None:
        params = list(self.model.parameters())
        flat = torch.cat([(a - p).reshape(-1) for a, p in zip(self.anchor, params, strict=True)])
        flat = self._mean(flat)
        offset = 0
        for a in self.anchor:
            a.grad = flat[offset:offset + a.numel()].view_as(a)
            offset += a.numel()
        self.outer.step()
        for a, p in zip(self.anchor, params, strict=True):
            a.grad = None
            p.copy_(a)

    def _mean(self, flat: torch.Tensor) -> torch.Tensor:
        """The pseudo-gradient averaged over the replicas: every rank is one, one all-reduce."""
        flat /= dist.get_world_size()
        dist.all_reduce(flat)
        return flat

    def shared_state(self) -> dict:
        return {"anchor": [a.detach().cpu().clone() for a in self.anchor],
                "outer": self.outer.state_dict()}

    def restore(self, shared: dict | None, mine: dict | None) -> None:
        if shared:
            with torch.no_grad():
                for a, saved in zip(self.anchor, shared["anchor"], strict=True):
                    a.copy_(saved)
            self.outer.load_state_dict(shared["outer"])
        super().restore(shared, mine)


def sync_interval(decision: CommDecision, configured: int) -> int:
    """H: comm=auto's pick when auto chose the method, else --sync-every."""
    return int((decision.chosen or {}).get("sync_every") or configured)


def periodic_method(comm: str, every: int, model, optimizer, steps: int, device: torch.device,
                    start_step: int) -> Periodic:
    """The method `comm` names (diloco, localsgd), syncing every `every` steps from `start_step`;
    the built-in trainer's (`make_periodic`) and a script's (`api.scriptrun`)."""
    kind = DiLoCo if comm == "diloco" else LocalSGD
    return kind(model, optimizer, every, steps, device, start_step=start_step)


def make_periodic(cfg: TrainConfig, env: DistEnv, decision: CommDecision, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, ckpt: dict | None,
                  mine: dict | None) -> Periodic | None:
    """The built-in trainer's periodic method for `decision` (None for a per-step comm hook), on
    its model and inner optimizer, resumed from `ckpt` and this rank's part `mine`."""
    comm = decision.comm
    if comm not in PERIODIC_NAMES:
        return None
    h = sync_interval(decision, cfg.sync_every)
    method = periodic_method(comm, h, model, optimizer, cfg.steps, env.device,
                             ckpt["step"] if ckpt else 0)
    method.restore(ckpt.get("periodic") if ckpt else None, mine.get("periodic") if mine else None)
    if env.is_main:
        what = (f"outer SGD lr {OUTER_LR} Nesterov momentum {OUTER_MOMENTUM}"
                if comm == "diloco" else "parameter averaging")
        log.info("%s: sync every %d steps (%s), %.1f MB per sync, %.2f MB per step on average",
                 comm, h, what, method.param_bytes / 1e6, method.param_bytes / h / 1e6)
    return method

