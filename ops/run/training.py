"""A training run's launch, as `up` and `launch` make it: one call from the command.

What a training run needs before its rendezvous port opens (the host firewall on every node, the
staged data as the manifest says), then the run made the cluster's latest and launched
(`launch.launch`, which netcheck's sweep uses without these two checks). docs/ARCHITECTURE.md,
"Inside ops".
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fatpipe.infra.node import REMOTE_VENV

from ..data.check import require_data
from ..rdzv.noderun import LaunchResult, NodeRun, Sink
from ..reach.cluster import Cluster
from ..reach.firewall_check import require_firewall
from .launch import Follow, launch


def checker_python(nodes: list[NodeRun]) -> str | None:
    """The interpreter that hashes a node's data: the run's own when one was given, else python3."""
    python = nodes[0].plan.python if nodes else None
    return None if python in (None, f"{REMOTE_VENV}/bin/python") else python


def launch_training(cluster: Cluster, nodes: list[NodeRun], run_dir: Path, warn: Callable[[str], None], *,
                    follow: Follow, sink: Sink | None = None) -> LaunchResult:
    """Check, mark and launch the run of `nodes` on the deployed `cluster`; `warn` gets each warning
    to show before the run starts (a cluster that opted out of its firewall).

    A node without its firewall, or whose data differs, is refused in one line naming it. The
    launched run becomes the latest (what status, logs and stop mean); one that never started
    (nodes could not be prepared, a start refused) gives the mark back.
    """
    for warning in require_firewall(cluster):
        warn(warning)
    require_data(cluster, checker_python(nodes))
    before = cluster.latest_run_id()
    cluster.mark_latest(nodes[0].rdzv.run_id)
    try:
        return launch(cluster, nodes, run_dir, sink=sink, follow=follow)
    except BaseException:
        cluster.mark_latest(before)
        raise
