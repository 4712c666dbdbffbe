"""A run's files after the fact, shared by `status`, `logs`, `runs`, `stop` and the run steps:
whether a node still exists here, bringing what the nodes wrote back. Apart from the run steps
(cli/steps.py) so the commands that read a run import no launch machinery.
"""

from __future__ import annotations

from rich.markup import escape

from fatpipe.ops.run.pullpaths import pull_declared, source_of_run
from fatpipe.ops.run.sync import pull_runs
from fatpipe.stacks.sim.links import netns_exists


def node_gone(node) -> bool:
    """Whether a run's node no longer exists on this machine (a sim namespace removed by `down`):
    then its folder's files are all there is, and asking it would only time out."""
    return node.plan.transport == "netns" and not netns_exists(node.plan.netns or "")


def pull_results(out, nodes, run_dir, run_id: str, cluster: str, checkpoints: bool = False):
    """Bring what the ssh nodes wrote for the run into its folder here; one line per node whose
    pull failed (its files stay on the node). Returns the ops.run.sync.Pulled."""
    pulled = pull_runs(nodes, run_dir, checkpoints=checkpoints)
    for failure in pulled.failed:
        out.print(f"[yellow]warning[/]: {escape(failure)}", soft_wrap=True)
    if pulled.placed and not checkpoints:
        out.print(f"results of run {run_id} pulled from {len(pulled.placed)} node(s); checkpoints stay on "
                  f"the nodes (fatpipe runs pull {cluster} {run_id} --checkpoints)", highlight=False)
    return pulled


def show_declared_pulls(project, node, out) -> None:
    """`[run] pull`: what the run's script wrote on the node of rank 0 (a NodeRun, ops.run.leader),
    one line per path."""
    for pulled, line in pull_declared(project, source_of_run(node)):
        out.print(("" if pulled else "[yellow]warning[/]: ") + escape(line), highlight=False, soft_wrap=True)
