"""`fatpipe catalog PROVIDER`: the machine catalog in use; for AWS, refresh it from the EC2 API."""

from __future__ import annotations

import os

import click

from .options import console, pass_project


@click.command()
@click.argument("provider", type=click.Choice(["aws", "digitalocean"]))
@click.option("--region", help="AWS: refresh the catalog for this region from DescribeInstanceTypes.")
@click.option("--offline", is_flag=True, help="Only show the catalog in use; call no API.")
@click.option("--top", type=int, default=3, show_default=True, help="Types shown per tier.")
@pass_project
def catalog(project, provider: str, region: str | None, offline: bool, top: int):
    """Show the cheapest machine types per tier (judged on baseline bandwidth).

    With `aws --region R` it first refreshes the catalog from the EC2 API (boto3, your AWS
    credentials) into .fatpipe/catalog/aws-R.json, which then takes precedence for R.
    """
    from fatpipe.infra.catalog import load_catalog
    from fatpipe.infra.spec import TIER_GBPS
    from fatpipe.stacks.providers import provider_for

    out = console()
    if region and not offline:
        path = provider_for(provider).refresh_catalog(region, project.root)
        out.print(f"refreshed: {os.path.relpath(path)}")
    found = load_catalog(provider, region, project.root)
    out.print(f"[bold]{found.label()}[/]", soft_wrap=True)
    out.print(_table(found, TIER_GBPS, top))
    out.print("[dim]Gbit/s: baseline (sustained) bandwidth; burst: the ceiling on network credits[/]")


def _table(found, tiers: dict[str, int], top: int):
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column, justify in [("tier", "left"), ("type", "left"), ("Gbit/s", "right"),
                            ("burst", "right"), ("vCPU", "right"), ("GiB", "right"),
                            ("arch", "left"), ("$/hour", "right")]:
        table.add_column(column, justify=justify, no_wrap=True)
    for tier, gbps in tiers.items():
        candidates = found.qualifying(gbps)[:top]
        if not candidates:
            table.add_row(tier, "(none)", "", "", "", "", "", "")
        for i, t in enumerate(candidates):
            table.add_row(tier if i == 0 else "", t.name, f"{t.baseline_gbps:g}", f"{t.peak_gbps or 0:g}",
                          str(t.vcpus), f"{t.memory_gib:g}", t.arch, f"{t.price_hourly:.4f}")
    return table
