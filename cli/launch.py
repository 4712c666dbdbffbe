"""`fatpipe launch [CLUSTER] [-- SCRIPT ARGS]`: run torchrun on every node and stream their logs."""

from __future__ import annotations

import sys

import click

from .options import cluster_argument, console, pass_project
from .runflags import (
    ScriptCommand,
    new_rendezvous,
    overrides,
    run_options,
    script_args,
    train_overrides,
)

COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red")


def log_sink(out, names: list[str]):
    """Print each node's log line prefixed with its name, one color per node."""
    from rich.text import Text

    width = max(len(n) for n in names)
    styles = {name: COLORS[i % len(COLORS)] for i, name in enumerate(names)}

    def sink(node: str, line: str) -> None:
        out.print(Text.assemble((f"{node:<{width}} | ", styles.get(node, "")), line), soft_wrap=True)

    return sink


def note(out):
    return lambda message: out.print(message, style="dim", markup=False, highlight=False)


def exit_table(result):
    from rich.table import Table

    table = Table(title="exit status", title_justify="left")
    table.add_column("node")
    table.add_column("exit", justify="right")
    for name, code in result.exit_codes.items():
        shown = "lost" if code is None else str(code)
        table.add_row(name, f"[green]{shown}[/]" if code == 0 else f"[red]{shown}[/]")
    return table


@click.command(cls=ScriptCommand)
@cluster_argument
@click.option("--run", "run_id", default=None,
              help="Start this run's rendezvous (from `fatpipe rendezvous`) instead of a new one.")
@train_overrides
@run_options
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=None,
              help="Stop every node after this many seconds (exit 124).")
@click.option("--detach", is_flag=True, help="Start and return; follow later with `fatpipe logs -f`.")
@pass_project
def launch(project, cluster: str | None, run_id, outputs_file, nproc_per_node, max_restarts,
           join_timeout, remote_python, timeout_s, detach):
    """Sync, start torchrun on every node, stream the logs; exit with the worst node's status.

    Everything after `--` is your torchrun script and its arguments (e.g. `-- train.py --lr 3e-4`);
    without it, the built-in trainer runs with [train] and the overrides given here. Ctrl-C stops
    the run on every node.
    """
    from fatpipe.infra.errors import FatpipeError
    from fatpipe.infra.launch import refuse_if_running
    from fatpipe.infra.rendezvous import read_rendezvous
    from fatpipe.infra.runs import find_run, load_outputs

    name = project.cluster(cluster).name
    outputs = load_outputs(project, name, outputs_file)
    refuse_if_running(project, name)
    if run_id:
        if script_args() or overrides():
            raise FatpipeError("--run starts a rendezvous as written; give no script or [train] overrides")
        run_id, run_dir = find_run(project, name, run_id)
        rdzv = read_rendezvous(run_dir)
    else:
        rdzv, run_dir = new_rendezvous(project, outputs, nproc_per_node=nproc_per_node, max_restarts=max_restarts,
                                       join_timeout_s=join_timeout, remote_python=remote_python)
    result = run_training(project, outputs, rdzv, run_dir, console(), timeout_s=timeout_s, detach=detach)
    sys.exit(result.exit_code)


def run_training(project, outputs, rdzv, run_dir, out, timeout_s=None, detach=False):
    """Launch `rdzv`, print every node's log, then the exit table; returns the LaunchResult."""
    from fatpipe.infra.launch import launch as launch_run

    names = [n.name for n in rdzv.nodes]
    result = launch_run(
        project, rdzv, run_dir, sink=log_sink(out, names), log=note(out), timeout_s=timeout_s,
        detach=detach, gpus_per_node=outputs.gpus_per_node,
    )
    if detach:
        out.print(f"run {rdzv.run_id} started; follow it with: fatpipe logs {outputs.name} -f")
        return result
    out.print(exit_table(result))
    if result.interrupted:
        out.print("[yellow]interrupted[/]: the run was stopped on every node")
    elif result.timed_out:
        out.print(f"[red]timed out[/] after {timeout_s:g} s: the run was stopped on every node")
    out.print(f"logs and results in {run_dir}", markup=False)
    return result
