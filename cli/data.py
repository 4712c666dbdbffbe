"""`fatpipe data`: the project's dataset. Each subcommand lives in a module of its own."""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute", loaded when called (a command module imports no other one).
SUBCOMMANDS = {"prepare": "fatpipe.cli.dataprep:prepare"}


class _LazyData(click.Group):
    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *SUBCOMMANDS})

    def get_command(self, ctx, name):
        if name not in SUBCOMMANDS:
            return super().get_command(ctx, name)
        module, attr = SUBCOMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=_LazyData)
def data():
    """Prepare the project's dataset."""
