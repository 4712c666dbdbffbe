"""`fatpipe init`: write a commented fatpipe.toml for one provider."""

from __future__ import annotations

from pathlib import Path

import click

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_atomic
from fatpipe.infra.templates import TEMPLATES


@click.command()
@click.option("--provider", type=click.Choice(sorted(TEMPLATES)), default="sim", show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.pass_context
def init(ctx: click.Context, provider: str, force: bool):
    """Write a commented fatpipe.toml to start from."""
    path = Path((ctx.find_root().obj or {}).get("config_path") or "fatpipe.toml")
    if path.exists() and not force:
        raise FatpipeError(f"{path} already exists; pass --force to overwrite it", exit_code=2)
    write_atomic(path, TEMPLATES[provider])
    click.echo(f"wrote {path} ({provider}); edit it, then `fatpipe config` to check it")
