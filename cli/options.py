"""Options and helpers shared by several commands, defined once."""

from __future__ import annotations

import functools

import click

cluster_argument = click.argument("cluster", required=False)


def pass_project(func):
    """Hand the command the loaded Project (fatpipe.toml or the embedded default) as `project`."""

    @click.pass_context
    @functools.wraps(func)
    def wrapper(ctx: click.Context, *args, **kwargs):
        from fatpipe.infra.project import load_project

        path = (ctx.find_root().obj or {}).get("config_path")
        return ctx.invoke(func, *args, project=load_project(path), **kwargs)

    return wrapper


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)
