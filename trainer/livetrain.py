"""The built-in trainer under `fault_tolerance = "live"` (docs/ARCHITECTURE.md, "Live fault
tolerance"): one replica group per node, torchft's Manager across them.

Each node runs its own torchrun (`--nnodes 1`): its ranks form the default process group and
DDP averages over them; the comm hook then averages over the replica groups in the quorum
(`live.step.across_replicas`). Steps commit only when torchft says so (`live.step.LiveStep`).

Data: one stream for the whole cluster, cut by step. At step b, rank r of the K ranks the
cluster declares reads batches (b-1)*K + r (times grad_accum, plus the micro-batch): a node
that joins late reads exactly the batches of the step it joins at, and the batches of a node
that is down are not read by anyone, and counted (`skipped_batches` in the summary).

Checkpoints: each node writes its own (the node's rank 0: model, optimizer, scheduler, the
Manager's step) on its own disk; after a loss of every node each resumes from its own, and the
first quorum brings a node that is behind up to the one furthest ahead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .api.ddpcomm import register_timed_hook, use_comm
from .api.record import RunRecord
from .checkpoint import load_agreed_checkpoint, save_checkpoint
from .collectives import all_gather_objects
from .comm.allreduce import barrier, sync
from .comm.autolive import AUTO_LIVE_HOOKS, decide_live_comm, healing_in_quorum, measure_local
from .comm.decision import CommDecision
from .comm.layout import settle_layout
from .comm.regions import read_region
from .config import ConfigError, TrainConfig
from .data import Corpus, ShardedBatches, describe_data
from .datacheck import check_same_data
from .distenv import DistEnv
from .heldout import heldout_loss, heldout_windows
from .live.manager import live_manager, settings_from_env
from .live.membership import Attempts, QuorumWatch, run_fields, step_fields
from .live.runplan import (
    live_across_regions,
    live_comm,
    node_run_dir,
    own_record,
    require_torchft,
)
from .live.step import GATHER_S, LiveStep, across_replicas
from .model import seeded_gpt
from .optim import build_optimizer, build_scheduler
from .replicas import param_digest
from .torchstate import autocast, configure_determinism

log = logging.getLogger(__name__)

# Attempts at one step that may fail in a row (each one a quorum and a failed all-reduce, a few
# seconds) before the run gives up: a group that cannot commit for minutes is not coming back.
MAX_FAILED_ATTEMPTS = 40


class LiveTrainer:
    def __init__(self, cfg: TrainConfig, env: DistEnv, store: dist.Store,
                 data: tuple[Corpus, Corpus | None]):
        self.cfg, self.env, self.device = cfg, env, env.device
        self.corpus, self.val_corpus = data
        require_torchft()
        # comm=auto: decided at step 1 by its quorum (`comm.autolive`), or sent by a peer on joining.
        self.comm = "auto" if cfg.comm == "auto" else live_comm(cfg.comm)
        self.settings = settings_from_env()
        self._flat_across_regions(read_region())
        cfg = dataclasses.replace(cfg, out=str(node_run_dir(cfg.out_dir, self.settings.node_rank)))
        self.cfg = cfg
        self.ranks = self.settings.nodes * env.world_size  # the cluster's declared ranks
        self.rank = self.settings.node_rank * env.world_size + env.rank
        self.node_tokens = cfg.batch_size * cfg.seq_len * cfg.grad_accum * env.world_size
        self.record = RunRecord(cfg, env, store,
                                mirror=own_record(cfg.out_dir, self.settings.node_rank))
        self.run_dir = cfg.out_dir

    def _flat_across_regions(self, region: str) -> None:
        """Live never opens the regions (`comm.hiersetup`): refused where [train] asks for a sync
        between them every few steps (as the launch refuses it), said once where it does not."""
        if not region:
            return
        if refused := live_across_regions(self.cfg.cross_comm, self.cfg.auto_periodic,
                                          f"this node in {region}"):
            raise ConfigError(refused)
        if self.settings.node_rank == 0 and self.env.is_main and self.cfg.cross_comm != "flat":
            log.info("regions (this node in %s): one ring over every rank (fault_tolerance live "
                     "syncs every node every step; a sync between regions every few steps, "
                     "cross_comm = \"diloco\", needs fault_tolerance = \"restart\")", region)

    def setup(self) -> None:
        cfg, env = self.cfg, self.env
        configure_determinism(cfg.deterministic, env.device)
        self.model = seeded_gpt(cfg.preset, cfg.seq_len, self.corpus.vocab_size, cfg.seed,
                                self.device)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        check_same_data(self.corpus, self.device)  # across the node's ranks
        self.data = ShardedBatches(self.corpus, cfg.seq_len, cfg.batch_size, 0, 1, cfg.seed,
                                   holdout=self.val_corpus is None)
        self.ddp = DDP(self.model, device_ids=[env.local_rank] if self.device.type == "cuda"
                       else None, bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=True)
        self.meter = register_timed_hook(self.ddp, self.device)
        settle_layout(self.ddp, self.ddp, self.meter, cfg.batch_size, cfg.seq_len)
        self.optimizer = build_optimizer(self.model, cfg.lr, self.device)
        self.scheduler = build_scheduler(self.optimizer, cfg.warmup_steps, cfg.steps)
        ckpt = load_agreed_checkpoint(self.run_dir / "checkpoints", self.device)
        if ckpt:
            self._load_state(ckpt)
        # comm=auto: decided by the groups of step 1's quorum, in each attempt at it
        # (`_forward_backward`); a group that joins later is sent the hook. Here what needs no
        # network, before any quorum waits on it.
        self.local = measure_local(cfg, env, self.model) if self.comm == "auto" and not ckpt else None
        # Last: the Manager joins the quorum, which must not wait on this node's setup.
        self.manager = live_manager(self.settings, self._state, self._load_state,
                                    env.local_rank, env.world_size)
        if ckpt:
            self.manager.load_state_dict(ckpt["manager"])
        self.meter.across, self.meter.node_size = across_replicas(self.manager), env.world_size
        # After `across`: PowerSGD's state is built on the Manager (`live.powersgd`).
        if self.comm != "auto":
            use_comm(self.meter, cfg, CommDecision(self.comm, "set by --comm"))
        elif ckpt and ckpt.get("comm") in AUTO_LIVE_HOOKS:
            self._use_auto(ckpt["comm"])
        self.live = LiveStep(self.manager, self.model, self.optimizer, self.scheduler)
        self.quorum = QuorumWatch()
        gathered = self.live.gather(self.settings.nodes, GATHER_S)
        if gathered < self.settings.nodes and self.live.step == 1:
            log.warning("starting with %d of %d nodes: the others join when they are up",
                        gathered, self.settings.nodes)
        self.record.open()
        if env.is_main:
            # Alike on every node (the terminal shows it once): the node is in the line's prefix.
            log.info("%s: %.2fM parameters, fault tolerance live: %d nodes, %d rank(s) each, "
                     "comm %s, start at step %d", cfg.preset, self.model.num_params() / 1e6,
                     self.settings.nodes, env.world_size, self.comm, self.live.step)
            log.info("data: %s", describe_data(self.corpus, self.val_corpus, cfg.seq_len))

    # What a returning replica group is sent by a peer, and what a checkpoint holds.
    def _state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "comm": self.meter.name}

    def _load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.comm == "auto" and state.get("comm") in AUTO_LIVE_HOOKS:
            self._use_auto(state["comm"])  # the hook the run's first quorum chose

    def _use_auto(self, comm: str) -> None:
        """comm=auto's hook, sent plain in a step where a group is healing (it does not know the
        hook yet: `comm.autolive`)."""
        self.meter.use(comm)
        self.meter.plain_while = lambda: healing_in_quorum(self.manager)

    def run(self) -> None:
        failed, failed_s, attempts = 0, 0.0, Attempts()
        while self.live.step <= self.cfg.steps:
            start, lr = time.perf_counter(), self.scheduler.get_last_lr()[0]
            attempts.begin(self.live.step)
            self.meter.begin_step()
            loss, result = self.live.attempt(self._forward_backward)
            self.meter.settle(result.committed, result.healed)
            sync(self.device)
            if not result.committed:
                failed += 1
                failed_s += time.perf_counter() - start  # the stall's split: its failed attempts
                if failed >= MAX_FAILED_ATTEMPTS:
                    raise RuntimeError(f"step {self.live.step}: {failed} attempts in a row did "
                                       f"not commit: {self.manager.errored()}")
                log.warning("step %d not committed (attempt %d): taken again at the next quorum",
                            self.live.step, failed)
                continue
            failed = 0
            step = self.live.step - 1
            rec = self.record.measure(step, loss, lr, time.perf_counter() - start,
                                      self.node_tokens * result.participants,
                                      self.meter.end_step(), self.meter.name)
            rec.update(step_fields(result.participants, result.healed, result.quorum_s, rec,
                                   attempts.of(step), {**result.timings, "failed_s": failed_s}))
            failed_s = 0.0
            if change := self.quorum.update(step, result.participants):
                self.record.nodes.event(*change, step)
                log.warning("quorum: %s", change[1])  # every node alike: the terminal shows it once
            self.record.write(rec)
            if step == self.cfg.steps or (self.cfg.checkpoint_every
                                          and step % self.cfg.checkpoint_every == 0):
                self.save(step)
        self.finish()

    def _forward_backward(self, step: int) -> float:
        cfg, total = self.cfg, torch.zeros((), device=self.device)
        if step == 1 and self.local:  # every group of a step-1 quorum decides (`comm.autolive`)
            self._use_auto(decide_live_comm(cfg, self.env, self.model, self.manager, self.local).comm)
        for micro in range(cfg.grad_accum):
            x, y = (t.to(self.device) for t in self.data.batch_at(
                ((step - 1) * self.ranks + self.rank) * cfg.grad_accum + micro))
            last = micro == cfg.grad_accum - 1
            with contextlib.nullcontext() if last else self.ddp.no_sync():
                with autocast(self.device):
                    _, loss = self.ddp(x, y)
                (loss / cfg.grad_accum).backward()
            total += loss.detach()
        return total.item() / cfg.grad_accum

    def save(self, step: int) -> None:
        """This node's checkpoint, by its rank 0 (every rank of a group holds the same state)."""
        if self.env.is_main:
            save_checkpoint(self.run_dir / "checkpoints", step, {
                **self._state(), "step": step, "manager": self.manager.state_dict(),
                "config": self.cfg.to_dict(), "world_size": self.env.world_size})
            self.record.faults.save()

    def finish(self) -> None:
        digests = all_gather_objects(param_digest(self.model), self.device)
        if self.env.is_main:
            self._write_summary(digests)
        barrier(self.device)

    def _write_summary(self, digests: list[str]) -> None:
        records = self.record.records()
        held = heldout_windows(self.corpus, self.val_corpus, self.cfg.seq_len)
        eval_loss, eval_windows = heldout_loss(self.model, *held, self.cfg.batch_size, self.device,
                                               self.cfg.eval_windows)
        participants = sorted(r.get("participants", 1) for r in records) or [1]
        self.record.write_summary(
            records, self.node_tokens * participants[len(participants) // 2],
            comm=self.meter.name, preset=self.cfg.preset, params=self.model.num_params(),
            param_digests=digests, replicas_in_sync=len(set(digests)) == 1,
            eval_loss=eval_loss, eval_windows=eval_windows,
            data=describe_data(self.corpus, self.val_corpus, self.cfg.seq_len),
            fault_tolerance="live", node=self.settings.replica_id, world_size=self.ranks,
            **run_fields(records, self.settings.nodes, self.node_tokens,
                         self.env.world_size * self.cfg.grad_accum))

    def close(self) -> None:
        if hasattr(self, "live"):
            self.live.close()
        self.record.close()


def run_live_training(cfg: TrainConfig, env: DistEnv, store: dist.Store,
                      data: tuple[Corpus, Corpus | None]) -> Path:
    trainer = LiveTrainer(cfg, env, store, data)
    try:
        trainer.setup()
        trainer.run()
    except Exception as e:
        trainer.record.fail(e)
        raise
    finally:
        trainer.close()
    return trainer.run_dir
