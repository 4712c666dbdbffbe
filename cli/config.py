"""`fatpipe config`: the resolved settings of one cluster (or all) and of [train]."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from fatpipe.infra.firewall import member_sources, run_ports, trust_summary, trusted_sources
from fatpipe.infra.nodespec import cluster_node
from fatpipe.infra.project import train_warnings
from fatpipe.stacks.toolkit import report

from .options import console, pass_project


@pass_project
def config(project, cluster: str | None, as_json: bool):
    """The body of `fatpipe config`; its options and help are declared in cluster_commands.py."""
    toolkit = report()  # from package metadata: nothing is imported
    clusters = [project.cluster(cluster)] if cluster else list(project.clusters.values())
    resolved = {c.name: _resolved(project, c) for c in clusters}
    warnings = train_warnings(project.train)
    if as_json:
        doc = {
            "config": project.label,
            "clusters": resolved,
            "train": project.train.model_dump(mode="json"),
            "warnings": warnings,
            "toolkit": toolkit,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    out = console()
    out.print(f"[bold]config[/]: {project.label}")
    out.print(f"[bold]toolkit[/]: {toolkit['summary']}", highlight=False)
    for name, values in resolved.items():
        out.print(_table(f"cluster {name}", values))
    out.print(_table("train", project.train.model_dump(mode="json")))
    for warning in warnings:
        out.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False)


def _resolved(project, cluster) -> dict:
    """The cluster's settings, with `node` the environment its nodes get: [node] and its own keys."""
    resolved = cluster.model_dump(mode="json")
    summary = trust_summary(cluster)
    if summary:  # what the host firewall lets in (docs/ARCHITECTURE.md, "The node firewall")
        resolved["firewall_trusts"] = {"sources": trusted_sources(cluster), "summary": summary,
                                       "run_ports": run_ports(cluster), "run_ports_from": member_sources(cluster)}
    return resolved | {"node": cluster_node(project.spec, cluster.name).model_dump(mode="json")}


def _table(title: str, values: dict):
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in values.items():
        if key == "firewall_trusts":
            value = value["summary"]
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    return table
