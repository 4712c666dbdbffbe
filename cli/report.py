"""`fatpipe report [CLUSTER]`: one self-contained HTML page (and PNGs) from a run folder."""

from __future__ import annotations

import click

from fatpipe.infra.runs import find_run
from fatpipe.ops.plan.report import write_report

from .options import cluster_argument, console, pass_project


@click.command()
@cluster_argument
@click.option("--run", "run_id", default=None, help="Which run (default: the latest).")
@pass_project
def report(project, cluster: str | None, run_id):
    """Draw the run: loss, step time split into compute and exposed communication, sync latency,
    link use against the tier, the netcheck sweep, the comm decision, restarts and failures."""
    name = project.cluster(cluster).name
    run_id, run_dir = find_run(project, name, run_id)
    path = write_report(run_dir)
    console().print(f"report of run {run_id}: {path}", markup=False, soft_wrap=True)
