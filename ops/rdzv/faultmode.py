"""Which fault tolerance a run gets: `[train] fault_tolerance` as named, or (`auto`, the default)
live where it works and restart elsewhere, with the reason (docs/ARCHITECTURE.md, "Live fault
tolerance").

Live works for the built-in trainer on 3 nodes or more (a majority is left when one is lost:
`trainer.live.quorum.majority`; on 2 nodes node 0's loss would stop the run), with a comm
that runs every step (periodic methods sync every H steps, which live does not do), and
torchft on every node: the launch falls back to restart when the node environment check finds
a node without it (`restart_instead`). A user's script opts in with `fault_tolerance = "live"`,
since it needs `fatpipe.optimizer`, a line only its author can add.

`live` named for the built-in trainer across regions with a sync between regions every few
steps (cross_comm = "diloco", or auto with auto_periodic) is refused: live never opens the
regions, and the run would send float32 over the slow link every step without a word.
"""

from __future__ import annotations

from dataclasses import dataclass

from fatpipe.infra.errors import ConfigError
from fatpipe.trainer.live.quorum import STANDBY_MIN_NODES
from fatpipe.trainer.live.runplan import LIVE_COMMS, live_across_regions


@dataclass(frozen=True)
class FaultMode:
    """The mode in force and why: the launch's decision line."""

    mode: str  # "restart" or "live"
    why: str
    auto: bool = False  # chosen by `auto`: the launch may still fall back to restart

    def line(self) -> str:
        return f"fault tolerance: {self.mode} ({self.why})"


def choose_fault_mode(spec, nnodes: int, runs: str) -> FaultMode:
    """The mode for a run of `spec` (a TrainSpec) on `nnodes` nodes; `runs`: "trainer" (the
    built-in one), "script" (a user's) or "entry" (a torchrun entry of fatpipe's own, netcheck's
    benchmark: restart, and nothing to say)."""
    if runs == "entry" and spec.fault_tolerance != "live":
        return FaultMode("restart", "")
    if spec.fault_tolerance != "auto":
        return FaultMode(spec.fault_tolerance, "[train] fault_tolerance")
    if runs == "script":
        return FaultMode("restart", "auto: a script runs live when it sets fault_tolerance = "
                                    "\"live\" and wraps its optimizer with fatpipe.optimizer", True)
    if nnodes < STANDBY_MIN_NODES:
        return FaultMode("restart", f"auto: {nnodes} node(s); live needs {STANDBY_MIN_NODES} or more, "
                                    "so that a majority is left when one is lost", True)
    if getattr(spec, "cross_comm", "auto") == "diloco":
        return FaultMode("restart", "auto: cross_comm = diloco syncs between regions every few steps, "
                                    "live every step", True)
    periodic = spec.comm not in ("auto", *LIVE_COMMS)
    # auto_periodic: comm=auto's periodic methods, and cross_comm auto's DiLoCo between regions.
    if periodic or (spec.auto_periodic and "auto" in (spec.comm, getattr(spec, "cross_comm", "auto"))):
        what = f"comm={spec.comm}" if periodic else "auto_periodic"
        return FaultMode("restart", f"auto: {what} syncs every few steps, live every step", True)
    return FaultMode("live", f"auto: the built-in trainer on {nnodes} nodes; a lost node costs "
                             "seconds, not a restart", True)


def refuse_live_across_regions(spec, mode: str, runs: str, regions: list[str]) -> None:
    """ConfigError (exit 2) for the built-in trainer under live across `regions` (each node's,
    two names or more) where [train] asks for a sync between them every few steps."""
    names = sorted(set(regions))
    if mode != "live" or runs != "trainer" or len(names) < 2:
        return
    why = live_across_regions(getattr(spec, "cross_comm", "auto"), spec.auto_periodic, ", ".join(names))
    if why:
        raise ConfigError(why)


def declared_regions(cluster) -> list[str]:
    """The regions a cluster's spec puts its nodes in, as their outputs name them (sim and vm:
    `regions` groups r0, r1, ...; AWS: its regions): what `up` knows before deploying."""
    count = getattr(cluster, "regions", None)
    if isinstance(count, int):
        return [f"r{i}" for i in range(count)]
    return list(cluster.node_regions)


def without_torchft(reports: dict) -> list[str]:
    """The nodes of a node environment check (`ops.env.nodeenv`) that have no torchft."""
    return [name for name, report in reports.items() if not report.get("torchft")]
