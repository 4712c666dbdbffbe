"""`fatpipe synth [CLUSTER]`: write each cluster's Terraform JSON and show what it will cost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from rich import box
from rich.table import Table

from fatpipe.stacks.app import synth as synth_stacks
from fatpipe.stacks.providers import provider_for
from fatpipe.stacks.toolkit import report

from .options import console, pass_project


@pass_project
def synth(project, cluster: str | None, as_json: bool):
    """The body of `fatpipe synth`; its options and help are declared in cluster_commands.py."""
    specs = [project.cluster(cluster)] if cluster else list(project.clusters.values())
    # Priced first: a machine type below its tier fails here, before the provider imports.
    estimates = {spec.name: provider_for(spec.provider).estimate(spec, project.root) for spec in specs}
    folders = synth_stacks(project, specs)
    rows = [_row(spec, estimates[spec.name], folders[spec.name] / "cdk.tf.json") for spec in specs]
    toolkit = report()
    if as_json:
        click.echo(json.dumps({"clusters": rows, "toolkit": toolkit}, indent=2))
        return
    out = console()
    out.print(_table(rows))
    # Paths on lines of their own: a table column would fold them, and they are for copying.
    for r in rows:
        out.print(f"{r['cluster']}: {r['json']}", soft_wrap=True)
    out.print("[dim]Gbit/s: each node's baseline (sustained, not burst) private bandwidth; (limit): "
              "a documented ceiling, not a measured baseline: netcheck tells what you get[/]")
    out.print(f"[dim]synthesized with {toolkit['summary']}[/]", highlight=False)
    for prices in sorted({e.prices for e in estimates.values() if e.hourly}):
        out.print(f"[dim]$/hour: all nodes, estimated from the offline {prices}[/]")
    for extras in sorted({e.extras for e in estimates.values() if e.extras}):
        out.print(f"[dim]  including per node: {', '.join(extras)}[/]")
    for spec in specs:
        for warning in provider_for(spec.provider).warnings(spec):
            out.print(f"[yellow]warning[/]: {warning}", soft_wrap=True)


def _row(cluster, est, path: Path) -> dict:
    return {
        "cluster": cluster.name,
        "provider": cluster.provider,
        "nodes": cluster.nodes,
        "machine": est.machine,
        "baseline_gbps": est.baseline_gbps,
        "bandwidth_basis": est.bandwidth_basis,
        "tier": cluster.tier,
        "usd_per_hour": None if est.hourly is None else round(est.hourly, 4),
        "json": _shown(path),
    }


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def _table(rows: list[dict]):
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column, justify in [("cluster", "left"), ("provider", "left"), ("nodes", "right"),
                            ("machine", "left"), ("Gbit/s", "right"), ("tier", "left"),
                            ("$/hour", "right")]:
        table.add_column(column, justify=justify, no_wrap=True)
    for r in rows:
        price = "?" if r["usd_per_hour"] is None else f"{r['usd_per_hour']:.2f}"
        baseline = "?" if r["baseline_gbps"] is None else f"{r['baseline_gbps']:g}"
        if r["bandwidth_basis"] != "baseline":
            baseline += " (limit)" if r["bandwidth_basis"] == "documented limit" else " (declared)"
        table.add_row(r["cluster"], r["provider"], str(r["nodes"]), r["machine"], baseline,
                      r["tier"], price)
    return table
