"""Which fault tolerance a run gets: `[train] fault_tolerance` as named, or (`auto`, the default)
live where it works and restart elsewhere, with the reason (docs/ARCHITECTURE.md, "Live fault
tolerance").

Live works for the built-in trainer on 3 nodes or more (a majority is left when one is lost:
`trainer.live.lighthouse.majority`; on 2 nodes node 0's loss would stop the run), with a comm
that runs every step (periodic methods sync every H steps, which live does not do), and
torchft on every node: the launch falls back to restart when the node environment check finds
a node without it (`restart_instead`). A user's script opts in with `fault_tolerance = "live"`,
since it needs `fatpipe.optimizer`, a line only its author can add.
"""

from __future__ import annotations

from dataclasses import dataclass

from fatpipe.trainer.live.lighthouse import STANDBY_MIN_NODES
from fatpipe.trainer.live.runplan import LIVE_COMMS


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
    if spec.comm not in ("auto", *LIVE_COMMS) or (spec.comm == "auto" and spec.auto_periodic):
        what = "auto_periodic" if spec.comm == "auto" else f"comm={spec.comm}"
        return FaultMode("restart", f"auto: {what} syncs every few steps, live every step", True)
    return FaultMode("live", f"auto: the built-in trainer on {nnodes} nodes; a lost node costs "
                             "seconds, not a restart", True)


def without_torchft(reports: dict) -> list[str]:
    """The nodes of a node environment check (`ops.env.nodeenv`) that have no torchft."""
    return [name for name, report in reports.items() if not report.get("torchft")]
