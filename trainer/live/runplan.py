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


def hierarchical_key(cross_comm: str, auto_periodic: bool) -> str | None:
    """The [train] setting that asks for a sync between regions every few steps (DiLoCo between
    regions, `comm.hiersetup.hierarchical`), or None: live syncs every replica group every step."""
    if cross_comm == "diloco":
        return 'cross_comm = "diloco"'
    if cross_comm == "auto" and auto_periodic:
        return 'auto_periodic = true (cross_comm = "auto")'
    return None


def live_across_regions(cross_comm: str, auto_periodic: bool, regions: str) -> str | None:
    """Why a live run across `regions` is refused (None: it is not): live syncs one flat ring
    every step and never opens the regions, so a sync between regions every few steps would
    silently become float32 over the slow link every step."""
    key = hierarchical_key(cross_comm, auto_periodic)
    if key is None:
        return None
    return (f'fault_tolerance = "live" with {key} across regions ({regions}): live syncs one '
            f'ring over every node every step, never between regions every few steps; set '
            f'fault_tolerance = "restart" (or "auto"), or cross_comm = "flat"')


def node_run_dir(run_dir: Path, node_rank: int) -> Path:
    """Where a node writes its records and checkpoints: node 0 the run folder itself, node k
    `live-node-<k>/` inside it, so nodes that share a disk (the sim's) never write the same file."""
    return run_dir if node_rank == 0 else run_dir / f"live-node-{node_rank}"


def own_record(node_dir: Path, node_rank: int) -> Path | None:
    """Where node 0 keeps a copy of its own record (metrics.jsonl, summary.json): the run
    folder's becomes the run's, merged from every node's `live-node-<k>/` once the run ends
    (`ops.run.headline`), since node 0 may be the node that was away. None for the others,
    whose folder is their own already."""
    return node_dir / "live-node-0" if node_rank == 0 else None
