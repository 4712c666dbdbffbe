"""What a command's body takes, shared by several: its `Request`, the loaded project, the console, [train]
with the run's overrides (the flags themselves are declared in declare.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import click
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.project import error_report, load_project, train_warnings
from fatpipe.infra.trainspec import TrainSpec


@dataclass(frozen=True)
class Request:
    """What a command was asked besides its own parameters: the script and its arguments after
    `--`, the [train] overrides, the run options (ops.rdzv.rendezvous.RunOptions' fields),
    --on-signal and --force. `pass_request` reads it from click once; the steps take it as given."""

    script: tuple[str, ...] = ()
    overrides: dict = field(default_factory=dict)
    run_options: dict = field(default_factory=dict)
    on_signal: str | None = None
    force: bool = False


def pass_request(func):
    """Hand the command its `Request` as `request`: the one place that reads what the options
    stored on click's context (nothing below the command reads that context)."""

    @click.pass_context
    @functools.wraps(func)
    def wrapper(ctx: click.Context, *args, **kwargs):
        meta = ctx.meta
        request = Request(tuple(meta.get("script", ())), dict(meta.get("train", {})),
                          dict(meta.get("run_options", {})), meta.get("on_signal"), bool(meta.get("force")))
        return ctx.invoke(func, *args, request=request, **kwargs)

    return wrapper


def pass_project(func=None, *, clusters_optional: bool = False):
    """Hand the command the loaded Project (fatpipe.toml or the embedded default) as `project`.

    `clusters_optional`: the command needs no cluster, so a file with only [train] will do.
    """
    if func is None:
        return functools.partial(pass_project, clusters_optional=clusters_optional)

    @click.pass_context
    @functools.wraps(func)
    def wrapper(ctx: click.Context, *args, **kwargs):
        path = (ctx.find_root().obj or {}).get("config_path")
        return ctx.invoke(func, *args, project=load_project(path, clusters_optional), **kwargs)

    return wrapper


def console(stderr: bool = False):
    return Console(stderr=stderr, highlight=False)


def resolve_train(project, overrides: dict):
    """[train] with this run's overrides, validated like the file (every problem at once); warns
    on stderr about settings that are valid but surely not meant."""
    try:
        spec = TrainSpec.model_validate({**project.train.model_dump(), **overrides})
    except ValidationError as e:
        messages = []
        for err in e.errors(include_url=False):
            key = str(err["loc"][0]) if err["loc"] else ""
            where = ("--" + key.replace("_", "-")) if key in overrides else f"[train] {key}".strip()
            messages.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        if len(messages) == 1:
            raise ConfigError(messages[0]) from None
        raise ConfigError(error_report("train settings", messages)) from None
    for warning in train_warnings(spec):
        console(stderr=True).print(f"[yellow]warning[/]: {escape(warning)}", highlight=False)
    return spec
