"""`fatpipe catalog PROVIDER`: the machine catalog in use; refresh it from the provider's API (EC2,
DigitalOcean sizes)."""

from __future__ import annotations

import os

import click
from rich import box
from rich.table import Table

from fatpipe.infra.catalog import load_catalog
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.spec import TIER_GBPS
from fatpipe.stacks.providers import provider_for

from .options import console, pass_project


@pass_project
def catalog(project, provider: str, region: str | None, types: str, families: str, offline: bool, top: int):
    """The body of `fatpipe catalog`; its options and help are declared in cluster_commands.py."""
    out = console()
    wanted = _names(types), _names(families)
    if _should_refresh(provider, region, offline, any(wanted)):
        path, changed = provider_for(provider).refresh_catalog(region, project.root, *wanted)
        out.print(f"refreshed: {os.path.relpath(path)} ({len(changed) or 'no'} change(s))", soft_wrap=True)
        for line in changed:
            out.print(f"  {line}", soft_wrap=True, markup=False)
    found = load_catalog(provider, region, project.root)
    out.print(f"[bold]{found.label()}[/]", soft_wrap=True)
    out.print(_table(found, TIER_GBPS, top))
    out.print("[dim]Gbit/s: baseline (sustained) bandwidth; burst: the ceiling on network credits[/]")


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _should_refresh(provider: str, region: str | None, offline: bool, filtered: bool) -> bool:
    """Whether to refresh from the provider's API first: the provider says when (AWS for a named
    region, DigitalOcean whenever its token is in the environment)."""
    if offline:
        return False
    try:
        return provider_for(provider).refresh_wanted(region, filtered)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None


def _table(found, tiers: dict[str, int], top: int):
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
