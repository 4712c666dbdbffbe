"""`fatpipe rendezvous [CLUSTER] [-- SCRIPT ARGS]`: write a run's rendezvous files from the outputs."""

from __future__ import annotations

import click

from .options import ScriptCommand, cluster_argument, pass_project, run_options, train_overrides
from .render import print_rendezvous
from .steps import new_rendezvous


@click.command(cls=ScriptCommand)
@cluster_argument
@train_overrides
@run_options
@pass_project
def rendezvous(project, cluster: str | None, outputs_file):
    """Write rendezvous.json, node-<rank>.env and node-<rank>.sh for a new run.

    Everything after `--` is your torchrun script and its arguments; without it, the
    built-in trainer runs with the [train] settings (and the overrides given here). The run
    becomes the latest (what `launch --run`, status and logs mean): it exists to be launched,
    by `fatpipe launch --run ID` or by hand on each node.
    """
    from fatpipe.infra.runs import load_outputs, mark_latest

    outputs = load_outputs(project, project.cluster(cluster).name, outputs_file)
    rdzv, run_dir = new_rendezvous(project, outputs)
    mark_latest(project, outputs.name, rdzv.run_id)
    print_rendezvous(rdzv, run_dir)
