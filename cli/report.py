"""`fatpipe report [CLUSTER]`: one self-contained HTML page (and PNGs) from a run folder."""

from __future__ import annotations

from fatpipe.infra.runs import find_run
from fatpipe.ops.plan.report import write_report

from .options import console, pass_project


@pass_project
def report(project, cluster: str | None, run_id):
    """The body of `fatpipe report`; its options and help are declared in run_commands.py."""
    name = project.cluster(cluster).name
    run_id, run_dir = find_run(project, name, run_id)
    path = write_report(run_dir)
    console().print(f"report of run {run_id}: {path}", markup=False, soft_wrap=True)
