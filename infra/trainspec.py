"""The `[train]` table of fatpipe.toml: defaults for the built-in trainer, one key per trainer flag."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """A table of fatpipe.toml: unknown keys are errors, defaults are validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class TrainSpec(Strict):
    """Defaults for the built-in trainer; each key maps to the trainer flag --key-with-dashes."""

    preset: Literal["tiny", "small", "124m"] = "small"
    steps: int = Field(200, ge=1)
    comm: Literal["auto", "none", "bf16", "fp16", "powersgd", "diloco", "localsgd"] = "auto"
    batch_size: int = Field(8, ge=1)
    seq_len: int | None = Field(None, ge=8, le=8192)  # unset: 256, or 1024 for 124m on GPT-2 tokens
    grad_accum: int = Field(1, ge=1)
    lr: float = Field(6e-4, gt=0, le=1)
    warmup_steps: int = Field(20, ge=0)
    checkpoint_every: int = Field(50, ge=1)
    node_metrics_every: int = Field(10, ge=0)  # steps per node-metrics window; 0: off
    eval_windows: int = Field(128, ge=1)  # held-out windows the final eval loss reads
    timeout_s: float = Field(300.0, gt=0)  # collective timeout: a lost peer fails the attempt
    bucket_cap_mb: float = Field(25.0, gt=0)
    seed: int = 1337
    data: str | None = None
    compile: bool = False
    powersgd_rank: int = Field(4, ge=1)
    sync_every: int = Field(16, ge=1)  # diloco/localsgd: optimizer steps between syncs
    redecide: bool = True  # comm=auto: re-probe and maybe switch hooks when steps drift off
    # comm=auto may pick diloco/localsgd, and only at an interval of MIN_AUTO_SYNC_EVERY (50)
    # steps or more: they change the optimizer, so auto takes them only when asked.
    auto_periodic: bool = False
    # Between regions (a cluster across regions): flat, one ring over every node at every step;
    # diloco, DiLoCo's outer step between regions every H steps on int8 pseudo-gradients, DDP
    # inside each; auto: diloco where auto_periodic allows periodic methods, else flat.
    cross_comm: Literal["auto", "flat", "diloco"] = "auto"
    # What a lost node costs (docs/ARCHITECTURE.md, "Live fault tolerance"): restart resumes every
    # node from the last checkpoint; live keeps the nodes that are up training; auto: live where
    # it works (ops.rdzv.faultmode), else restart.
    fault_tolerance: Literal["auto", "restart", "live"] = "auto"

    def trainer_args(self) -> list[str]:
        """The trainer's command-line flags for these settings."""
        args: list[str] = []
        for key, value in self.model_dump().items():
            flag = "--" + key.replace("_", "-")
            if value is None:
                continue
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + key.replace("_", "-"))
            else:
                args += [flag, str(value)]
        return args
