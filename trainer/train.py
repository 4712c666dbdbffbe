"""The training run: build model, data, DDP and comm hook from a TrainConfig; train; checkpoint.

Read top to bottom: `Trainer.setup` (resume point, comm choice, DDP), `Trainer.run` (the loop),
`Trainer.train_step` (one optimizer step and its measurements), then checkpoints and summary.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import math
import os
import random
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from .allreduce import slowest, sync
from .autocomm import CommDecision, choose_comm, powersgd_wire_elements, probe_link, read_netcheck
from .checkpoint import load_agreed_checkpoint, save_checkpoint
from .collectives import all_gather_objects, broadcast_object, gather_objects
from .config import HOOK_NAMES, TrainConfig
from .data import DataCursor, ShardedBatches, load_corpus
from .distenv import DistEnv
from .files import write_text_atomic
from .hooks import (
    TimedCommHook,
    load_powersgd_state,
    make_powersgd_state,
    powersgd_available,
    powersgd_state_dict,
)
from .metrics import MetricsLog, read_metrics, summarize
from .model import GPT, preset_config
from .netbench import busbw_gbs
from .nic import NicMeter, traffic_interface
from .optim import build_optimizer, build_scheduler

log = logging.getLogger(__name__)

GRAD_CLIP = 1.0
_MIB = 1 << 20


class Trainer:
    def __init__(self, cfg: TrainConfig, env: DistEnv):
        self.cfg, self.env, self.device = cfg, env, env.device
        self.run_dir = cfg.out_dir
        self.tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum * env.world_size
        self.metrics: MetricsLog | None = None

    # ---- setup -------------------------------------------------------------------------------

    def setup(self) -> None:
        cfg, env = self.cfg, self.env
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _configure_determinism(cfg.deterministic, env.device)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = GPT(preset_config(cfg.preset, cfg.seq_len)).to(self.device)
        self.grad_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        ckpt = load_agreed_checkpoint(self.run_dir / "checkpoints", self.device)
        self.start_step = ckpt["step"] if ckpt else 0
        if ckpt:
            self.model.load_state_dict(ckpt["model"])
        self.decision = self._decide_comm(ckpt)
        self.comm = self.decision["comm"]
        self._wrap_ddp()
        self._layout_warmup()
        self._install_hook(ckpt)
        self.optimizer = build_optimizer(self.model, cfg.lr, self.device)
        self.scheduler = build_scheduler(self.optimizer, cfg.warmup_steps, cfg.steps)
        cursor = DataCursor()
        if ckpt:
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
            cursor = DataCursor(**ckpt["data_cursor"])
            self._restore_rng(ckpt)
        self.data = ShardedBatches(load_corpus(cfg.data), cfg.seq_len, cfg.batch_size,
                                   env.rank, env.world_size, cfg.seed, cursor)
        self.nic = NicMeter(traffic_interface())
        if env.is_main:
            log.info("%s: %.2fM parameters, %d ranks (%s), comm %s, NIC %s, start at step %d",
                     cfg.preset, self.model.num_params() / 1e6, env.world_size, env.backend,
                     self.comm, self.nic.interface, self.start_step)
            self.metrics = MetricsLog(self.run_dir, cfg.steps, self.start_step)
        # Each rank's own RNG stream after the shared init (dropout, if ever turned on).
        if not ckpt:
            torch.manual_seed(cfg.seed + 1 + env.rank)

    def _decide_comm(self, ckpt: dict | None) -> dict:
        cfg, env = self.cfg, self.env
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
        compute_s = self._measure_compute()
        # netcheck.json may exist on rank 0's disk only.
        link = broadcast_object(read_netcheck(self.run_dir) if env.is_main else None, 0,
                                self.device) or probe_link(self.device, self.grad_bytes)
        shapes = [p.shape for p in self.model.parameters()]
        decision = choose_comm(
            link, compute_s, cfg.grad_accum, self.grad_bytes,
            powersgd_bytes=powersgd_wire_elements(shapes, cfg.powersgd_rank) * 4,
            buckets=max(1, math.ceil(self.grad_bytes / (cfg.bucket_cap_mb * _MIB))),
            powersgd_buckets=1 if env.backend == "gloo" else None,
            world_size=env.world_size,
            hooks=tuple(h for h in HOOK_NAMES if h != "powersgd" or powersgd_available()))
        if env.is_main:
            log.info("%s", decision.describe())
        return broadcast_object(decision.to_dict(), 0, self.device)  # one hook on every rank

    def _measure_compute(self) -> float:
        """Seconds of forward + backward for one step, no communication (slowest rank)."""
        x = torch.zeros(self.cfg.batch_size, self.cfg.seq_len, dtype=torch.long,
                        device=self.device)
        times = []
        with _fork_rng(self.device):
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(self.cfg.grad_accum):
                    with _autocast(self.device):
                        _, loss = self.model(x, x)
                    loss.backward()
                sync(self.device)
                times.append(time.perf_counter() - start)
        self.model.zero_grad(set_to_none=True)
        return slowest(min(times[1:]), self.device)

    def _wrap_ddp(self) -> None:
        cap = self.cfg.bucket_cap_mb
        if self.comm == "powersgd" and self.env.backend == "gloo":
            # powerSGD_hook issues its P and Q all-reduces from future callbacks; on gloo two
            # buckets' callbacks interleave differently on each rank (seen here: "collective
            # mismatch" at the first compressed step). One bucket keeps the order fixed.
            cap = self.grad_bytes / _MIB + 1
            log.warning("comm=powersgd on gloo: one DDP bucket (bucket_cap_mb %.1f instead of "
                        "%.1f) to avoid a collective mismatch", cap, self.cfg.bucket_cap_mb)
        self.meter = TimedCommHook(self.device)
        self.ddp = DDP(self.model, device_ids=[self.env.local_rank]
                       if self.device.type == "cuda" else None,
                       bucket_cap_mb=cap, gradient_as_bucket_view=True)
        self.ddp.register_comm_hook(None, self.meter.hook)
        self.forward = self.ddp
        if self.cfg.compile and self.device.type == "cuda":
            # Compiling the DDP module lets Dynamo split graphs at bucket boundaries (overlap).
            self.forward = torch.compile(self.ddp)
        elif self.cfg.compile:
            log.info("--compile ignored: torch.compile is used on CUDA only")

    def _layout_warmup(self) -> None:
        """One synchronised step that changes nothing, so DDP settles its bucket layout.

        DDP rebuilds buckets in gradient-ready order after its first step. Doing that here
        means every real step, including the first after a restart, sees the same layout, which
        PowerSGD's per-bucket error feedback and warm start depend on.
        """
        x = torch.zeros(self.cfg.batch_size, self.cfg.seq_len, dtype=torch.long,
                        device=self.device)
        self.meter.passthrough = True
        with _fork_rng(self.device):
            with _autocast(self.device):
                _, loss = self.forward(x, x)
            loss.backward()
        self.ddp.zero_grad(set_to_none=True)
        self.meter.passthrough = False

    def _install_hook(self, ckpt: dict | None) -> None:
        state = None
        if self.comm == "powersgd":
            state = make_powersgd_state(self.cfg.powersgd_rank, self.cfg.warmup_steps,
                                        self.cfg.seed)
            mine = self._rank_state(ckpt)
            if mine and mine.get("powersgd"):
                load_powersgd_state(state, mine["powersgd"], self.device)
        self.meter.use(self.comm, state)

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        cfg = self.cfg
        for step in range(self.start_step + 1, cfg.steps + 1):
            rec = self.train_step(step)
            if self.metrics:
                self.metrics.log(rec)
            if step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                self.save(step)
        self.finish()

    def train_step(self, step: int) -> dict:
        cfg = self.cfg
        lr = self.scheduler.get_last_lr()[0]
        self.meter.begin_step()
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(cfg.grad_accum):
            x, y = (t.to(self.device, non_blocking=True) for t in self.data.next_batch())
            # Only the last micro-batch synchronises gradients; the others accumulate locally.
            last = micro == cfg.grad_accum - 1
            with contextlib.nullcontext() if last else self.ddp.no_sync():
                with _autocast(self.device):
                    _, loss = self.forward(x, y)
                (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = loss_sum.item() / cfg.grad_accum
        sync(self.device)  # all streams, so the step time and the hook's CUDA events are final
        step_s = time.perf_counter() - start
        comm = self.meter.end_step()
        tx, rx = self.nic.rates()
        return {
            "step": step, "loss": loss_value, "lr": lr, "step_s": step_s,
            "tokens_per_s": self.tokens_per_step / step_s,
            "sync_s": comm.sync_s, "exposed_comm_s": comm.exposed_s,
            "grad_bytes": comm.grad_bytes, "wire_bytes": comm.wire_bytes,
            "busbw_gbps": (busbw_gbs(comm.wire_bytes, comm.sync_s, self.env.world_size) * 8
                           if comm.sync_s else 0.0),
            "nic_tx_gbps": tx, "nic_rx_gbps": rx, "comm": self.comm,
        }

    # ---- checkpoints -------------------------------------------------------------------------

    def save(self, step: int) -> None:
        """Collective: gather every rank's own state, then rank 0 writes the checkpoint."""
        mine = {"rng": _rng_state(self.device)}
        if self.meter.state is not None:  # error feedback differs per rank
            mine["powersgd"] = powersgd_state_dict(self.meter.state)
        every = gather_objects(mine, 0, self.device)
        if not self.env.is_main:
            return
        save_checkpoint(self.run_dir / "checkpoints", step, {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "data_cursor": self.data.cursor.to_dict(),
            "rank_states": every,
            "comm_decision": self.decision,
            "config": self.cfg.to_dict(),
            "world_size": self.env.world_size,
        })

    def _rank_state(self, ckpt: dict | None) -> dict | None:
        if not ckpt:
            return None
        states = ckpt["rank_states"]
        if len(states) != self.env.world_size:
            log.warning("checkpoint from %d ranks, now %d: per-rank RNG and PowerSGD error "
                        "feedback start fresh", len(states), self.env.world_size)
            return None
        return states[self.env.rank]

    def _restore_rng(self, ckpt: dict) -> None:
        mine = self._rank_state(ckpt)
        if mine:
            _set_rng_state(mine["rng"], self.device)

    # ---- the end -----------------------------------------------------------------------------

    def finish(self) -> None:
        """Collective: check the replicas agree, then rank 0 writes summary.json."""
        digests = all_gather_objects(param_digest(self.model), self.device)
        if self.meter.ran_powersgd and self.env.backend == "gloo":
            # powerSGD_hook's future callbacks can still be unwinding on gloo's worker threads
            # after backward returns; destroying the group under them aborts the process.
            time.sleep(0.5)
        if not self.env.is_main:
            return
        if len(set(digests)) != 1:
            log.error("replicas diverged: parameter digests differ across ranks")
        records = read_metrics(self.metrics.path)
        summary = summarize(
            records, self.tokens_per_step,
            comm=self.comm, comm_decision=self.decision, restarts=self.env.restarts,
            world_size=self.env.world_size, preset=self.cfg.preset,
            params=self.model.num_params(), param_digests=digests,
            replicas_in_sync=len(set(digests)) == 1)
        write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        log.info("summary: loss %.4f, %.0f tokens/s, step p50 %.1f ms, sync p50 %.1f ms -> %s",
                 summary["final_loss"] or float("nan"), summary["tokens_per_s"],
                 summary["step_s_p50"] * 1e3, summary["sync_s_p50"] * 1e3,
                 self.run_dir / "summary.json")

    def close(self) -> None:
        if self.metrics:
            self.metrics.close()


def param_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter and buffer's bytes: equal digests mean identical replicas."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        flat = t.detach().cpu().contiguous()
        # The tensor's memory as a buffer, without numpy (node venvs may lack it); `flat`
        # stays alive while the view is hashed.
        h.update((ctypes.c_char * (flat.numel() * flat.element_size())).from_address(
            flat.data_ptr()))
    return h.hexdigest()


def _configure_determinism(on: bool, device: torch.device) -> None:
    if not on:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic cuBLAS
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _fork_rng(device: torch.device):
    """Run measurement steps without moving any RNG stream the real steps use."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def run_training(cfg: TrainConfig, env: DistEnv) -> Path:
    """Build, train, and leave the results in cfg.out; returns the run directory."""
    trainer = Trainer(cfg, env)
    try:
        trainer.setup()
        trainer.run()
    finally:
        trainer.close()
    return trainer.run_dir
