"""`fatpipe data prepare|push|verify`: text into token shards (`dataprep.py`); stage the declared
dataset on every node, check it there.

The group (run_commands.py) loads its subcommands lazily, like the root group: a subcommand is a
module with a click command and one line in `SUBCOMMANDS` (`prepare` lives in a module of its own).
"""

from __future__ import annotations

import sys
import time

import click
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runs import load_outputs
from fatpipe.ops.data.check import check_data, declared_data, read_local_manifest
from fatpipe.ops.data.stage import push_data
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.guard import refuse_if_running
from fatpipe.trainer.staging.tidy import describe_removed

from .declare import cluster_argument, force_option, outputs_option, remote_python_option
from .options import console, pass_project, pass_request
from .render import note
from .signals import changing


@click.command()
@cluster_argument
@outputs_option
@remote_python_option
@force_option
@pass_project
@pass_request
def push(project, request, cluster, outputs_file, remote_python):
    """Send [data] over the uplink once, node to node as it lands, in a chain; skip what is there.

    An s3:// or https:// source is fetched by every node itself, in parallel, resumable."""
    cluster = Cluster.resolve(project, cluster)
    name = cluster.name
    cluster = cluster.deployed(load_outputs(project, name, outputs_file))
    outputs, out = cluster.outputs, console()
    with changing(project, name, "data push"):
        # A run reads this data: nothing changes under it, nor under one a node out of reach may run.
        if going := refuse_if_running(cluster, force=request.force):
            out.print(going, markup=False, highlight=False, soft_wrap=True)
        result = stage_with_progress(cluster, remote_python, out)
    for node, names in result.removed.items():
        out.print(f"{node}: {describe_removed(result.manifest, names)}", markup=False, highlight=False)
    if result.fetched is not None:
        out.print(f"[green]fetched[/] {result.manifest['path']} on {len(outputs.nodes)} node(s) from "
                  f"{result.manifest['source']}: {result.manifest['total_bytes']} bytes, "
                  f"{sum(result.fetched.values())} fetched ({result.elapsed_s:.1f} s)", highlight=False)
        return
    moved = result.moved
    uplink = "already on node 0" if result.uplink_s is None else \
        f"uplink {result.uplink_s:.1f} s ({result.uplinked} bytes)"
    fanout = "nothing to fan out" if result.fanout is None else f"{moved} byte(s) moved node to node"
    out.print(f"[green]staged[/] {result.manifest['path']} on {len(outputs.nodes)} node(s): "
              f"{result.manifest['total_bytes']} bytes, {uplink}, {fanout} ({result.elapsed_s:.1f} s)")


def stage_with_progress(cluster, remote_python, out):
    """Run the push with a progress bar for the fan-out: bytes, rate per link against the tier, ETA."""
    outputs = cluster.outputs
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TextColumn("{task.fields[rate]}"), TimeRemainingColumn()]
    with Progress(*columns, console=out, transient=True) as bar:
        task = bar.add_task(f"fan-out (tier {outputs.tier_gbps:g} Gbit/s per link)", total=None, rate="")
        receivers = max(1, len(outputs.nodes) - 1)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)
            elapsed = bar.tasks[task].elapsed or 0
            if elapsed > 0:
                gbps = done / receivers * 8 / elapsed / 1e9
                bar.update(task, rate=f"{gbps:.2f} of {outputs.tier_gbps:g} Gbit/s per link")

        fetches: dict[str, tuple[int, float]] = {}  # node -> (its line, when it began)

        def node_progress(node: str, held: int, total: int, fetched: int) -> None:
            """One line per node fetching a remote source: bytes held, rate of what it fetched."""
            if node not in fetches:
                fetches[node] = (bar.add_task(f"{node} fetching", total=total or None, rate=""), time.monotonic())
            line, began = fetches[node]
            elapsed = time.monotonic() - began
            rate = f"{fetched * 8 / elapsed / 1e6:.1f} Mbit/s" if elapsed > 0 else ""
            bar.update(line, completed=held, total=total or None, rate=rate)

        if getattr(cluster.data, "remote", False):  # none: push_data says so
            bar.remove_task(task)
        return push_data(cluster.logging(note(out)), remote_python=remote_python, progress=progress,
                         node_progress=node_progress)


@click.command()
@cluster_argument
@outputs_option
@remote_python_option
@pass_project
def verify(project, cluster, outputs_file, remote_python):
    """Every node reads and hashes all it holds against the manifest; exit 1 naming each node and file that differ."""
    cluster = Cluster.resolve(project, cluster)
    name = cluster.name
    declared_data(cluster)
    cluster = cluster.deployed(load_outputs(project, name, outputs_file))
    manifest = read_local_manifest(cluster)
    if manifest is None:
        raise FatpipeError(f"nothing staged on cluster {name} yet: run `fatpipe data push {name}`")
    out = console()
    verdicts = check_data(cluster, manifest, remote_python, rehash=True)  # no trust in the caches
    for v in verdicts:
        if v.problem:
            out.print(f"[red]{v.node}[/]: {escape(v.problem)}", markup=True, highlight=False)
        else:
            out.print(f"[green]{v.node}[/]: {manifest['path']} matches ({manifest['fingerprint'][:12]})")
    bad = [v.node for v in verdicts if v.problem]
    if bad:
        out.print(f"data differs on {', '.join(bad)}: `fatpipe data push {name}` fixes it")
        sys.exit(1)
