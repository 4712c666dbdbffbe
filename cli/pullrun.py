"""`fatpipe runs pull [CLUSTER] RUN [--checkpoints]`: bring a run's results back from its nodes."""

from __future__ import annotations

import sys

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runinfo import human_size
from fatpipe.ops.rdzv.noderun import run_nodes
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.sync import checkpoint_sizes

from .options import console, pass_project
from .results import node_gone, pull_results


@pass_project
def pull(project, names, checkpoints: bool):
    """The body of `fatpipe runs pull`; declared in run_commands.py."""
    if len(names) > 2:
        raise FatpipeError("runs pull takes [CLUSTER] RUN, e.g. `fatpipe runs pull demo latest`", exit_code=2)
    cluster, run_id = names if len(names) == 2 else (None, names[0])
    resolved = Cluster.resolve(project, cluster)
    name = resolved.name
    run_id, run_dir, nodes = run_nodes(resolved, None if run_id == "latest" else run_id)
    out = console()
    remote = [n for n in nodes if not n.transport.shares_fs and not node_gone(n)]
    if not remote:
        out.print(f"run {run_id}: its nodes share this machine's files; everything is in {run_dir}",
                  highlight=False)
        return
    if checkpoints:
        sizes = checkpoint_sizes(remote)
        for node, size in sizes.items():
            out.print(f"  {node:<20} checkpoints {'unknown' if size is None else human_size(size)}")
        known = [size for size in sizes.values() if size is not None]
        out.print(f"run {run_id}: {human_size(sum(known))} of checkpoints to pull", highlight=False)
    pulled = pull_results(out, remote, run_dir, run_id, name, checkpoints=checkpoints)
    if pulled.failed:
        sys.exit(1)
    out.print(f"pulled run {run_id} from {len(pulled.placed)} node(s) into {run_dir}", highlight=False)
