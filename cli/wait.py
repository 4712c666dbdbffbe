"""`fatpipe wait [CLUSTER]`: block until every node is reachable, booted and tuned as its tier declares."""

from __future__ import annotations

import click

from .options import cluster_argument, console, outputs_option, pass_project


def readiness_table(states, title: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in ("node", "transport", "reachable", "booted", "sysctls", "iface", "mtu", "state"):
        table.add_column(column)

    def mark(ok: bool, known: bool = True) -> str:
        return "[green]yes[/]" if ok else ("[red]no[/]" if known else "-")

    for s in states:
        sysctls = f"[green]{s.checked} ok[/]" if s.sysctls_ok else mark(False, s.booted)
        table.add_row(s.name, s.transport, mark(s.reachable), mark(s.booted, s.reachable), sysctls,
                      s.iface or "-", str(s.mtu or "-"),
                      "[green]ready[/]" if s.ready else f"[yellow]{s.reason}[/]")
    return table


def wait_ready(project, outputs, timeout_s: float, out):
    """Wait with a live summary line; returns the final per-node states."""
    from fatpipe.infra.wait import wait_for_nodes

    with out.status(f"waiting for {len(outputs.nodes)} node(s)") as status:
        def update(states):
            ready = sum(s.ready for s in states)
            pending = next((f"{s.name}: {s.reason}" for s in states if not s.ready), "")
            status.update(f"{ready}/{len(states)} node(s) ready {pending}")

        return wait_for_nodes(project, outputs, timeout_s=timeout_s, on_update=update)


@click.command()
@cluster_argument
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=600, show_default=True,
              help="Seconds to wait for every node.")
@outputs_option
@pass_project
def wait(project, cluster: str | None, timeout_s: float, outputs_file):
    """Wait until every node answers, has finished booting, and reads back the tier's sysctls."""
    from fatpipe.infra.runs import load_outputs

    name = project.cluster(cluster).name
    outputs = load_outputs(project, name, outputs_file)
    out = console()
    states = wait_ready(project, outputs, timeout_s, out)
    out.print(readiness_table(states, f"{name}: {sum(s.ready for s in states)}/{len(states)} ready"))
    require_ready(states, timeout_s)


def require_ready(states, timeout_s: float) -> None:
    """Raise naming every node that is not ready, with its reason."""
    from fatpipe.infra.errors import FatpipeError

    late = [s for s in states if not s.ready]
    if late:
        reasons = "\n  ".join(f"{s.name}: {s.reason}" for s in late)
        raise FatpipeError(f"{len(late)} node(s) not ready after {timeout_s:g} s:\n  {reasons}")
