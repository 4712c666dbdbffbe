"""Options and helpers shared by several commands, defined once."""

from __future__ import annotations

import functools

import click

cluster_argument = click.argument("cluster", required=False)
outputs_option = click.option(
    "--outputs", "outputs_file", type=click.Path(dir_okay=False, exists=True),
    help="Read this outputs file instead of .fatpipe/<cluster>/outputs.json.",
)
remote_python_option = click.option(
    "--remote-python", envvar="FATPIPE_REMOTE_PYTHON", default=None,
    help="On ssh nodes, run this interpreter (an image that ships torch) instead of making a venv. "
         "Env: FATPIPE_REMOTE_PYTHON.",
)


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
