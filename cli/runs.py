"""`fatpipe runs [CLUSTER]` lists a cluster's runs; `fatpipe runs prune [CLUSTER] --keep N` removes older ones
(`fatpipe runs pull`, which brings a run's results back from its nodes, is pullrun.py: listing imports no pull)."""

from __future__ import annotations

import json

import click
from rich import box
from rich.table import Table

from fatpipe.infra.runinfo import human_size, prune_runs
from fatpipe.infra.runinfo import list_runs as runs_of
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.guard import run_going
from fatpipe.ops.run.progress import with_live_latest

from .options import console, pass_project
from .signals import changing


@pass_project
def list_runs(project, cluster: str | None, as_json: bool):
    """The body of `fatpipe runs list`; `runs`' commands are declared in run_commands.py."""
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


@pass_project
def prune(project, cluster: str | None, keep: int, checkpoints_only: bool):
    """The body of `fatpipe runs prune`; `runs`' commands are declared in run_commands.py."""
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
