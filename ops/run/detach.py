"""What a signal on the operator's machine does to a run that is going (docs/ARCHITECTURE.md, "A run
lives on its nodes"): it lets go of it, never stops it by accident.

Only an explicit request stops a run: a Ctrl-C typed at the terminal, or `fatpipe stop`. A
termination (SIGTERM, SIGHUP, a SIGINT no terminal typed) is raised as `Detach` (cli/signals.py).
Until the run is started that is an interrupt like any: what was started is stopped and the
command cleans up. Once the run is going, the launch lets go of it: its nodes read `LET_GO`, the
run goes on there, and the command exits DETACHED with how to reattach and how to stop it.
"""

from __future__ import annotations

DETACHED = 76  # fatpipe let go of a run on a signal here: the run goes on on its nodes
LET_GO = "detached"  # the state of a node whose run fatpipe let go of (LaunchResult.unknown)


class Detach(KeyboardInterrupt):
    """A signal that asks the operator's side to let go (`why`: "SIGTERM", ...), not to stop the run."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def let_go(unknown: dict[str, str]) -> bool:
    """Whether the launch let go of the run (`LaunchResult.unknown`), rather than lost sight of it."""
    return LET_GO in unknown.values()


def detached_line(why: str, run_id: str, cluster: str) -> str:
    """The one line a command that let go of its run ends on: what, and how to reattach and to stop."""
    return (f"detached on {why}: run {run_id} goes on on its nodes (exit {DETACHED}); "
            f"`fatpipe logs {cluster} -f` reattaches, `fatpipe stop {cluster}` stops it")
