"""The trainer's run configuration: one validated object, and the argparse flags that fill it.

The flags mirror the `[train]` table of fatpipe.toml one to one (key `k` is `--k-with-dashes`),
plus a few flags that only make sense per run (`--out`, `--deterministic`, `--timeout-s`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

PRESETS = ("tiny", "small", "124m")
# The DDP comm hooks, least lossy first (comm=auto takes the first that fits). bf16 and fp16 put
# the same bytes on the wire; bf16 ranks first because it keeps float32's exponent range, so a
# gradient can lose precision but never overflow to inf or flush to zero, while fp16's failure
# is silent. PowerSGD is a low-rank approximation.
HOOK_NAMES = ("none", "bf16", "fp16", "powersgd")
# Methods that skip the per-step gradient sync and synchronise every `sync_every` steps instead
# (trainer/comm/periodic.py). DiLoCo first: at the same interval its outer Nesterov step reaches a
# lower loss than plain parameter averaging (DiLoCo, Douillard et al. 2023).
PERIODIC_NAMES = ("diloco", "localsgd")
COMMS = ("auto", *HOOK_NAMES, *PERIODIC_NAMES)
# Between regions (trainer/comm/regions.py): one ring over every rank, or DiLoCo between regions.
CROSS_COMMS = ("auto", "flat", "diloco")
# What a lost node costs (docs/ARCHITECTURE.md, "Live fault tolerance"): "restart" stops every
# worker and resumes from the last checkpoint (torchrun's elastic restart); "live" keeps the
# nodes that are up training at the next step (torchft), one replica group per node.
FAULT_TOLERANCE = ("auto", "restart", "live")


class ConfigError(ValueError):
    """A bad value given by the user; the entry point turns it into a one-line error."""

    def __init__(self, message: str, filename: str | None = None):
        super().__init__(message)
        self.filename = filename  # a path that does not exist: the launcher may say why


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs to know; validated on construction."""

    preset: str = "small"  # model size: tiny (~1M, tests), small (~25M), 124m (GPT-2 small)
    steps: int = 200  # optimizer steps
    comm: str = "auto"  # DDP comm hook; auto picks one from link bandwidth and step time
    batch_size: int = 8  # micro-batch per rank, in sequences
    seq_len: int | None = None  # tokens per sequence; unset: 256, or 1024 for 124m on GPT-2 tokens
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 6e-4  # peak learning rate, reached after warmup
    warmup_steps: int = 20  # linear warmup, then cosine decay to lr / 10
    checkpoint_every: int = 50  # steps between checkpoints (0: only the final one)
    bucket_cap_mb: float = 25.0  # DDP gradient bucket size
    seed: int = 1337  # model init and data order
    data: str | None = None  # text file or folder; default: text that ships with Python
    compile: bool = False  # torch.compile the model (CUDA only)
    powersgd_rank: int = 4  # PowerSGD matrix approximation rank
    sync_every: int = 16  # comm=diloco/localsgd: steps between syncs (auto picks its own)
    node_metrics_every: int = 10  # steps per node-metrics window (nodes.jsonl, events.jsonl); 0: off
    eval_windows: int = 128  # held-out windows the final eval loss reads (fewer: a faster end)
    redecide: bool = True  # comm=auto: re-probe and maybe switch hooks when steps drift off
    auto_periodic: bool = False  # comm=auto may pick diloco/localsgd (every >= 50 steps)
    cross_comm: str = "auto"  # across regions: flat, diloco (auto: diloco with auto_periodic)
    out: str = "run"  # run directory: metrics, summary, checkpoints, tb/
    deterministic: bool = False  # deterministic kernels, for bitwise-reproducible runs
    timeout_s: float = 300.0  # process-group timeout: a lost peer fails the run instead of hanging
    # restart (from a checkpoint) or live (torchft, per node); auto is the launch's to resolve
    # (ops.rdzv.faultmode): a trainer started without it restarts.
    fault_tolerance: str = "auto"

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"--preset must be one of {', '.join(PRESETS)}, not {self.preset!r}")
        if self.fault_tolerance not in FAULT_TOLERANCE:
            raise ConfigError(f"--fault-tolerance must be one of {', '.join(FAULT_TOLERANCE)}, "
                              f"not {self.fault_tolerance!r}")
        if self.comm not in COMMS:
            raise ConfigError(f"--comm must be one of {', '.join(COMMS)}, not {self.comm!r}")
        if self.cross_comm not in CROSS_COMMS:
            raise ConfigError(f"--cross-comm must be one of {', '.join(CROSS_COMMS)}, not {self.cross_comm!r}")
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "powersgd_rank",
                     "sync_every", "eval_windows"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "node_metrics_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "bucket_cap_mb", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{_flag(name)} must be > 0, got {getattr(self, name)}")
        if self.data is not None and not Path(self.data).exists():
            raise ConfigError(f"--data {self.data}: no such file or folder", filename=self.data)

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _flag(name: str) -> str:
    return name.replace("_", "-")


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (no usage dump) and exits 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = _OneLineErrorParser(
        prog="python -m fatpipe.trainer",
        description="Train a GPT on token shards or text (as bytes) with DDP; under torchrun or alone.",
    )
    p.add_argument("--preset", choices=PRESETS, default=d.preset)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--comm", choices=COMMS, default=d.comm)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="micro-batch per rank")
    p.add_argument("--seq-len", type=int, default=d.seq_len,
                   help="tokens per sequence (default 256; 1024 for 124m on GPT-2 tokens)")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--data", metavar="PATH", default=None,
                   help="token shards (.bin: nanoGPT's or llm.c's), or a text file or folder")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=d.compile)
    p.add_argument("--powersgd-rank", type=int, default=d.powersgd_rank)
    p.add_argument("--sync-every", type=int, default=d.sync_every)
    p.add_argument("--node-metrics-every", type=int, default=d.node_metrics_every)
    p.add_argument("--eval-windows", type=int, default=d.eval_windows,
                   help="held-out windows the final eval loss reads")
    p.add_argument("--redecide", action=argparse.BooleanOptionalAction, default=d.redecide)
    p.add_argument("--auto-periodic", action=argparse.BooleanOptionalAction,
                   default=d.auto_periodic)
    p.add_argument("--cross-comm", choices=CROSS_COMMS, default=d.cross_comm,
                   help="across regions: flat (one ring), diloco (int8 every H steps), auto")
    p.add_argument("--out", metavar="RUN_DIR", default=d.out)
    p.add_argument("--deterministic", action="store_true", default=d.deterministic)
    p.add_argument("--timeout-s", type=float, default=d.timeout_s)
    p.add_argument("--fault-tolerance", choices=FAULT_TOLERANCE, default=d.fault_tolerance,
                   help="restart: from the last checkpoint; live: the nodes that are up go on; "
                        "auto: what fatpipe's launch chose (live where it works), else restart")
    return p


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse flags into a TrainConfig; raises ConfigError for values argparse cannot check."""
    args = build_parser().parse_args(argv)
    return TrainConfig(**vars(args))
