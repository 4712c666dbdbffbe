"""The training run: build model, data, DDP and comm hook from a TrainConfig; train; checkpoint.

Read top to bottom: `Trainer.setup` (resume point, comm choice, DDP), `Trainer.run` (the loop),
`Trainer.train_step` (one optimizer step and its measurements), then checkpoints and summary.
The comm choice is `comm.commsetup`'s; RNG and autocast helpers are `torchstate`'s. What a user's
script gets from the public API (`api`), this trainer uses too: the timed comm hook on DDP
(`api.ddpcomm`) and the run folder's writers (`api.record`: each step's record, node metrics,
fault counts, summary.json).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .api.ddpcomm import grad_bytes, one_bucket_cap_mb, register_timed_hook, use_comm
from .api.record import RunRecord
from .checkpoint import load_agreed_checkpoint, load_rank_state, rank_folder, save_checkpoint
from .collectives import all_gather_objects
from .comm.allreduce import barrier, sync
from .comm.commsetup import decide_comm
from .comm.decision import CommDecision, decision_payload
from .comm.hiersetup import decide_inner, make_region_diloco, open_regions
from .comm.hooks import powersgd_state_dict
from .comm.layout import settle_layout
from .comm.periodic import make_periodic
from .comm.redecide import AutoComm
from .config import TrainConfig
from .data import Corpus, describe_data
from .datacheck import open_data
from .distenv import DistEnv
from .heldout import heldout_loss, heldout_windows
from .model import seeded_gpt
from .optim import build_optimizer, build_scheduler
from .replicas import param_digest
from .torchstate import autocast, configure_determinism, rng_state, set_rng_state

log = logging.getLogger(__name__)

GRAD_CLIP = 1.0


class Trainer:
    def __init__(self, cfg: TrainConfig, env: DistEnv, store: dist.Store,
                 data: tuple[Corpus, Corpus | None]):
        """`cfg` with its seq_len resolved; `data` the training corpus and validation split
        (`trainer.data.load_data`), opened before the process group so a bad file fails fast."""
        self.cfg, self.env, self.device = cfg, env, env.device
        self.corpus, self.val_corpus = data
        self.run_dir = cfg.out_dir
        self.tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum * env.world_size
        self.record = RunRecord(cfg, env, store)  # the run folder's files, as a script's run

    # ---- setup -------------------------------------------------------------------------------

    def setup(self) -> None:
        cfg, env = self.cfg, self.env
        self.run_dir.mkdir(parents=True, exist_ok=True)
        configure_determinism(cfg.deterministic, env.device)
        self.model = seeded_gpt(cfg.preset, cfg.seq_len, self.corpus.vocab_size, cfg.seed,
                                self.device)
        self.grad_bytes = grad_bytes(self.model)
        ckpt = load_agreed_checkpoint(self.run_dir / "checkpoints", self.device)
        # The same data on every rank, and the checkpoint's data position remapped or refused
        # (trainer/resume.py) before anything is measured or written.
        self.data, self.layout = open_data(cfg, env, ckpt, (self.corpus, self.val_corpus))
        mine = load_rank_state(self.run_dir / "checkpoints", ckpt, self.device)
        self.start_step = ckpt["step"] if ckpt else 0
        if ckpt:
            self.model.load_state_dict(ckpt["model"])
        self.regions = open_regions(cfg, env)  # across regions: DDP inside each, DiLoCo between
        if self.regions:
            self.decision = decide_inner(cfg, env, self.model, self.grad_bytes, ckpt, self.regions)
        else:
            self.decision = decide_comm(cfg, env, self.model, self.grad_bytes, ckpt)
        self.comm = self.decision.comm
        # Mid-run re-decisions probe the world's link: not the region's, so not across regions.
        auto_cfg = dataclasses.replace(cfg, redecide=False) if self.regions else cfg
        self.auto = AutoComm(auto_cfg, env, self.decision, self.start_step)  # check, re-decision
        self._wrap_ddp()
        settle_layout(self.forward, self.ddp, self.meter, cfg.batch_size, cfg.seq_len)
        self._install_hook(mine)
        self.optimizer = build_optimizer(self.model, cfg.lr, self.device)
        self.scheduler = build_scheduler(self.optimizer, cfg.warmup_steps, cfg.steps)
        if ckpt:
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
            if mine:
                set_rng_state(mine["rng"], self.device)
        if self.regions:
            self.periodic = make_region_diloco(cfg, env, self.decision, self.model, self.optimizer,
                                               self.regions, ckpt, mine)
        else:  # localsgd, diloco
            self.periodic = make_periodic(cfg, env, self.decision, self.model, self.optimizer, ckpt,
                                          mine)
        self.record.open()  # the NIC's rates from here; steps past the checkpoint are written again
        if env.is_main:
            log.info("%s: %.2fM parameters, %d ranks (%s), comm %s, NIC %s, fault tolerance "
                     "restart, attempt %d, start at step %d", cfg.preset, self.model.num_params() / 1e6,
                     env.world_size, env.backend, self.comm, self.record.nic.interface, env.attempt,
                     self.start_step)
            log.info("data: %s", describe_data(self.corpus, self.val_corpus, cfg.seq_len))
        # Each rank's own RNG stream after the shared init (dropout, if ever turned on).
        if not ckpt:
            torch.manual_seed(cfg.seed + 1 + env.rank)

    def _wrap_ddp(self, init_sync: bool = True) -> None:
        """DDP around the model; `init_sync=False` skips broadcasting rank 0's parameters (a
        mid-run rebuild, when every replica already holds the same ones)."""
        cap = self.cfg.bucket_cap_mb
        if self.comm == "powersgd" and self.env.backend == "gloo":
            cap = one_bucket_cap_mb(self.model)  # or the P and Q all-reduces interleave
            log.warning("comm=powersgd on gloo: one DDP bucket (bucket_cap_mb %.1f instead of "
                        "%.1f) to avoid a collective mismatch", cap, self.cfg.bucket_cap_mb)
        group = self.regions.region_group if self.regions else None
        self.ddp = DDP(self.model, device_ids=[self.env.local_rank]
                       if self.device.type == "cuda" else None, process_group=group,
                       bucket_cap_mb=cap, gradient_as_bucket_view=True, init_sync=init_sync)
        self.meter = register_timed_hook(self.ddp, self.device)
        self.meter.group = group
        self.forward = self.ddp
        if self.cfg.compile and self.device.type == "cuda":
            # Compiling the DDP module lets Dynamo split graphs at bucket boundaries (overlap).
            self.forward = torch.compile(self.ddp)
        elif self.cfg.compile:
            log.info("--compile ignored: torch.compile is used on CUDA only")

    def _install_hook(self, mine: dict | None) -> None:
        """The comm hook; PowerSGD's error feedback from this rank's checkpoint part `mine`."""
        use_comm(self.meter, self.cfg, self.decision, mine.get("powersgd") if mine else None)

    def rebuild_ddp(self, new: CommDecision) -> None:
        """comm=auto's mid-run switch to `new` (`comm.redecide`): DDP rebuilt exactly as setup does
        on a resume from this checkpoint (its bucket layout for the new hook, the layout warm-up,
        a fresh hook state)."""
        if self.meter.state is not None:
            norm = sum(float(e.norm()) ** 2 for e in self.meter.state.error_dict.values())
            log.info("leaving powersgd: its error feedback (norm %.3g) is dropped", norm ** 0.5)
        self.decision, self.comm = new, new.comm
        self.ddp = self.forward = self.meter = None
        gc.collect()  # the old reducer unregisters its autograd hooks when it is freed
        self._wrap_ddp(init_sync=False)  # the replicas are equal: nothing to broadcast
        settle_layout(self.forward, self.ddp, self.meter, self.cfg.batch_size, self.cfg.seq_len)
        self._install_hook(None)

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        cfg = self.cfg
        for step in range(self.start_step + 1, cfg.steps + 1):
            self.record.write(self.auto.observe(self.train_step(step)))
            if step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                # May switch hooks (rebuild_ddp), before the save.
                self.decision = self.auto.at_checkpoint(step, self.model, self.rebuild_ddp)
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
            # Under a periodic method none does: it syncs parameters every H steps instead.
            last = micro == cfg.grad_accum - 1 and self._syncs_every_step
            with contextlib.nullcontext() if last else self.ddp.no_sync():
                with autocast(self.device):
                    _, loss = self.forward(x, y)
                (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        if self.periodic:
            self.periodic.after_step(step)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = loss_sum.item() / cfg.grad_accum
        sync(self.device)  # all streams, so the step time and the hook's CUDA events are final
        step_s = time.perf_counter() - start
        inner = self.meter.end_step() if self._syncs_every_step else None
        comm = self.periodic.end_step(inner) if self.periodic else inner
        return self.record.measure(step, loss_value, lr, step_s, self.tokens_per_step, comm,
                                   self.comm)

    @property
    def _syncs_every_step(self) -> bool:
        """DDP syncs gradients every step: a comm hook's run, or DiLoCo between regions (its
        regions sync inside every step); not local SGD or DiLoCo over one link."""
        return not (self.periodic and self.periodic.skips_step_sync)

    # ---- checkpoints -------------------------------------------------------------------------

    def save(self, step: int) -> None:
        """Collective: every rank writes its own part on its own disk; after a barrier (so the
        shared part never names a missing one) rank 0 writes the shared part (`checkpoint`)."""
        folder = self.run_dir / "checkpoints"
        mine = {"rng": rng_state(self.device)}
        if self.meter.state is not None:  # error feedback differs per rank
            mine["powersgd"] = powersgd_state_dict(self.meter.state)
        if self.periodic:  # between syncs each replica's parameters and moments are its own
            mine["periodic"] = self.periodic.rank_state()
        save_checkpoint(rank_folder(folder, self.env.rank), step, mine, test_pause=False)
        barrier(self.device)
        if not self.env.is_main:
            return
        save_checkpoint(folder, step, {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "data_cursor": self.data.cursor.to_dict(),
            "data_layout": self.layout.record(self.data.cursor),
            "comm_decision": decision_payload(self.decision),
            "periodic": self.periodic.shared_state() if self.periodic else None,
            "config": self.cfg.to_dict(),
            "world_size": self.env.world_size,
        })
        self.record.faults.save()

    # ---- the end -----------------------------------------------------------------------------

    def finish(self) -> None:
        """Collective: check the replicas agree, rank 0 writes summary.json, and a barrier holds
        every rank until it is written: no worker ends with success before the results exist."""
        digests = all_gather_objects(param_digest(self.model), self.device)
        if self.env.is_main:
            self._write_summary(digests)
        barrier(self.device)  # the group's last collective

    def _write_summary(self, digests: list[str]) -> None:
        if len(set(digests)) != 1:
            log.error("replicas diverged: parameter digests differ across ranks")
        records = self.record.records()
        held = heldout_windows(self.corpus, self.val_corpus, self.cfg.seq_len)
        eval_loss, eval_windows = heldout_loss(self.model, *held, self.cfg.batch_size, self.device,
                                                 self.cfg.eval_windows)
        self.record.write_summary(
            records, self.tokens_per_step, comm=self.comm, fault_tolerance="restart",
            comm_decision=decision_payload(self.decision),
            preset=self.cfg.preset, params=self.model.num_params(), param_digests=digests,
            replicas_in_sync=len(set(digests)) == 1, eval_loss=eval_loss,
            eval_windows=eval_windows,
            data=describe_data(self.corpus, self.val_corpus, self.cfg.seq_len),
            regions=self.periodic.summary() if self.regions else None,
            **self.auto.summary(records))

    def close(self) -> None:
        self.record.close()


def run_training(cfg: TrainConfig, env: DistEnv, store: dist.Store,
                 data: tuple[Corpus, Corpus | None]) -> Path:
    """Build, train, and leave the results in cfg.out; returns the run directory.

    `store` is the run-wide store (it outlives this attempt), where failed collectives are counted.
    """
    trainer = Trainer(cfg, env, store, data)
    try:
        trainer.setup()
        trainer.run()
    except Exception as e:
        trainer.record.fail(e)  # a failed collective is counted in faults.json
        raise
    finally:
        trainer.close()
    return trainer.run_dir
