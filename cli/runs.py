"""`fatpipe runs [CLUSTER]` lists a cluster's runs; `fatpipe runs prune [CLUSTER] --keep N` removes older ones;
`fatpipe runs pull [CLUSTER] RUN [--checkpoints]` brings a run's results back from its nodes."""

from __future__ import annotations

import json
import sys

import click
from rich import box
from rich.table import Table

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runinfo import human_size, prune_runs
from fatpipe.infra.runinfo import list_runs as runs_of
from fatpipe.ops.rdzv.noderun import run_nodes
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.guard import run_going
from fatpipe.ops.run.progress import with_live_latest
from fatpipe.ops.run.sync import checkpoint_sizes

from .options import cluster_argument, console, pass_project
from .results import node_gone, pull_results
from .signals import changing


class DefaultToList(click.Group):
    """`fatpipe runs [CLUSTER]` means `fatpipe runs list [CLUSTER]`: a name that is no subcommand is a cluster."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultToList)
def runs():
    """List a cluster's runs (`fatpipe runs [CLUSTER]`), prune old ones (`fatpipe runs prune`), or pull
    one's results from its nodes (`fatpipe runs pull`)."""


@runs.command("list")
@cluster_argument
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_project
def list_runs(project, cluster: str | None, as_json: bool):
    """Every run, oldest first: outcome, steps, final loss, size on disk; * marks the latest."""
    resolved = Cluster.resolve(project, cluster)
    name = resolved.name
    found = runs_of(project, name)
    with_live_latest(resolved, found)  # a detached run on ssh nodes, as node 0 has it
    if as_json:
        click.echo(json.dumps([{"id": r.id, "latest": r.latest, "outcome": r.outcome, "steps": r.last_step,
                                "final_loss": r.final_loss, "size_bytes": r.size_bytes, "path": str(r.path)}
                               for r in found], indent=2))
        return
    out = console()
    if not found:
        out.print(f"{name} has no runs yet (fatpipe up {name})")
        return
    table = Table(title=f"runs of {name} (.fatpipe/{name}/runs/)", title_justify="left", box=box.SIMPLE_HEAD)
    for column, justify in [("run", "left"), ("outcome", "left"), ("steps", "right"),
                            ("final loss", "right"), ("size", "right")]:
        table.add_column(column, justify=justify, no_wrap=True)
    for r in found:
        loss = f"{r.final_loss:.4f}" if isinstance(r.final_loss, (int, float)) else "-"
        style = "green" if r.outcome == "ok" else "red" if r.outcome.startswith("failed") else None
        table.add_row(r.id + (" *" if r.latest else ""), r.outcome, "-" if r.last_step is None else str(r.last_step),
                      loss, human_size(r.size_bytes), style=style)
    out.print(table)
    total = sum(r.size_bytes for r in found)
    out.print(f"[dim]* the latest (what status, logs and stop mean); {len(found)} run(s), {human_size(total)}; "
              f"`fatpipe runs prune {name} --keep N` removes older ones[/]")


@runs.command("prune")
@cluster_argument
@click.option("--keep", type=click.IntRange(0), required=True, help="How many of the newest runs to keep.")
@click.option("--checkpoints", "checkpoints_only", is_flag=True,
              help="Remove only the older runs' checkpoints/ (the bulk), keeping their logs and metrics.")
@pass_project
def prune(project, cluster: str | None, keep: int, checkpoints_only: bool):
    """Remove all but the newest N runs; never the latest, nor one still running."""
    resolved = Cluster.resolve(project, cluster)
    name = resolved.name
    with changing(project, name, "runs prune"):  # not under an `up` whose run is not the latest yet
        busy = run_going(resolved)  # running, or maybe (a node out of reach)
        freed = prune_runs(project, name, keep, checkpoints_only, spare={busy.run_id} if busy else set())
    what = "checkpoints of " if checkpoints_only else ""
    out = console()
    for run_id, size in freed:
        out.print(f"  removed {what}{run_id} ({human_size(size)})")
    out.print(f"{name}: removed {what}{len(freed)} run(s), {human_size(sum(s for _, s in freed))} freed")


@runs.command("pull")
@click.argument("names", nargs=-1, required=True, metavar="[CLUSTER] RUN")
@click.option("--checkpoints", is_flag=True,
              help="Bring the run's checkpoints/ too (they stay on the nodes otherwise); prints their size first.")
@pass_project
def pull(project, names, checkpoints: bool):
    """Bring a run's results (logs, metrics, summary, events) back from its nodes; RUN may be `latest`.

    The nodes keep everything: a pull never deletes there, and goes through a partial folder
    here, so a failed one (named, exit 1) leaves the run folder as it was.
    """
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
