"""What `fault_tolerance = "live"` changes around a trainer, the built-in one and a user's script
alike: torchft must be there, the comm goes through torchft's all-reduce, and each node records
into a folder of its own (docs/ARCHITECTURE.md, "Live fault tolerance")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..config import ConfigError

# The hooks that go through torchft's all-reduce (PowerSGD's P and Q: `live.powersgd`).
LIVE_COMMS = ("none", "bf16", "fp16", "powersgd")


def require_torchft() -> None:
    if importlib.util.find_spec("torchft") is None:
        raise ConfigError("--fault-tolerance live needs torchft 0.2.0 (CPython 3.10-3.12 on "
                          "x86_64): pip install torchft==0.2.0, or --fault-tolerance restart")


def live_comm(comm: str) -> str:
    """The per-step comm under live: a script's comm=auto means none (the built-in trainer decides
    it once for every group: comm.autolive)."""
    if comm == "auto":
        return "none"
    if comm not in LIVE_COMMS:
        raise ConfigError(f"--comm {comm} does not run under --fault-tolerance live (use "
                          f"{', '.join(LIVE_COMMS)} or auto, or --fault-tolerance restart)")
    if comm == "powersgd" and importlib.util.find_spec("numpy") is None:
        raise ConfigError("--comm powersgd needs numpy (torch's PowerSGD seeds from it): "
                          "pip install numpy, or pick another --comm")
    return comm


def node_run_dir(run_dir: Path, node_rank: int) -> Path:
    """Where a node writes its records and checkpoints: node 0 the run folder itself (what
    `fatpipe top`, `report` and `pull` read), node k `live-node-<k>/` inside it, so nodes that
    share a disk (the sim's) never write the same file."""
    return run_dir if node_rank == 0 else run_dir / f"live-node-{node_rank}"
