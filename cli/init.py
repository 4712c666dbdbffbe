"""`fatpipe init`: write a commented fatpipe.toml for one provider, or add a cluster to the one there."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import click

from fatpipe.infra.clusters import shares_kernel
from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.files import write_atomic
from fatpipe.infra.project import parse_project, tomllib
from fatpipe.infra.spec import NAME_PATTERN, RESERVED_NAMES
from fatpipe.infra.templates import TEMPLATES


@click.pass_context
def init(ctx: click.Context, provider: str, force: bool, add_name: str | None):
    """The body of `fatpipe init`; its options and help are declared in cluster_commands.py."""
    path = Path((ctx.find_root().obj or {}).get("config_path") or "fatpipe.toml")
    if add_name:
        add_cluster(path, add_name, provider)
        return
    if path.exists() and not force:
        raise FatpipeError(f"{path} already exists; pass --force to overwrite it, or --add NAME to add "
                           "a cluster to it", exit_code=2)
    write_atomic(path, TEMPLATES[provider])
    click.echo(f"wrote {path} ({provider}); edit it, then `fatpipe config` to check it")


def add_cluster(path: Path, name: str, provider: str) -> None:
    """Append the template's cluster table for `provider`, named `name`, to `path` (made when missing)."""
    if not NAME_PATTERN.match(name) or name in RESERVED_NAMES:
        raise ConfigError(f"--add {name!r}: a cluster name is lowercase letters, digits and '-', starting "
                          f"with a letter, at most 24 characters, and not {' or '.join(RESERVED_NAMES)}")
    text = path.read_text() if path.exists() else ""
    data = _toml(text, path)
    clusters = data.get("clusters", {}) if isinstance(data.get("clusters"), dict) else {}
    if name in clusters:
        raise ConfigError(f"{path} already declares cluster {name!r}; declared: {', '.join(clusters)}")
    table = cluster_table(provider, name, clusters)
    if not text:
        new = TEMPLATES[provider].replace(_table_of(TEMPLATES[provider]), table)
    else:
        new = text.rstrip("\n") + "\n\n" + table + "\n"
    write_atomic(path, new)
    click.echo(f"added cluster {name} ({provider}) to {path}")
    try:
        parse_project(new, str(path))
    except ConfigError as e:  # a cloud cluster's key or address to fill in: say what, the file is written
        click.echo(f"edit it before deploying; `fatpipe config` now says:\n{e}")


def cluster_table(provider: str, name: str, others: dict) -> str:
    """The template's [clusters.<x>] table renamed; a sim one on a network no other sim cluster uses."""
    table = _table_of(TEMPLATES[provider])
    old = re.search(r"^\[clusters\.([a-z0-9-]+)\]", table, re.M).group(1)
    table = re.sub(rf"\bclusters\.{re.escape(old)}\b", f"clusters.{name}", table)
    if shares_kernel(provider):  # a sim cluster
        cidr = free_sim_cidr(others)
        table = re.sub(r"^# private_cidr = \"[^\"]*\"(.*)$",
                       f'private_cidr = "{cidr}"\\1; each sim cluster needs its own', table, flags=re.M)
    return table


def free_sim_cidr(clusters: dict) -> str:
    """10.N.0.0/24 overlapping no sim cluster's network (nor the loopback range derived from it)."""
    taken = []
    for table in clusters.values():
        if isinstance(table, dict) and shares_kernel(table.get("provider")):
            taken.append(ipaddress.IPv4Network(str(table.get("private_cidr", "10.42.0.0/24")), strict=False))
    for second in range(42, 256):
        net = ipaddress.IPv4Network(f"10.{second}.0.0/24")
        low = int(net.network_address) & 0xFFFFFF
        if not any(net.overlaps(t) or low == int(t.network_address) & 0xFFFFFF for t in taken):
            return str(net)
    raise ConfigError("no free 10.N.0.0/24 network for another sim cluster; set private_cidr by hand")


def _table_of(template: str) -> str:
    """The template's cluster table: from its [clusters.<x>] line to the blank line before [train]."""
    start = template.index("[clusters.")
    end = template.index("\n[train]", start)
    return template[start:end].rstrip("\n")


def _toml(text: str, path: Path) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); fix it before adding a cluster") from None
