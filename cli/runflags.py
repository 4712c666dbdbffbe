"""Flags shared by rendezvous, launch and up: [train] overrides, torchrun settings, `-- SCRIPT ARGS`."""

from __future__ import annotations

from typing import Literal, get_args, get_origin

import click

from fatpipe.infra.errors import ConfigError

from .options import outputs_option, remote_python_option


class ScriptCommand(click.Command):
    """A command whose arguments after `--` are the user's script and its args (`ctx.meta["script"]`).

    Split off before click parses, so `fatpipe launch -- train.py` does not take `train.py`
    for the optional CLUSTER argument.
    """

    def parse_args(self, ctx, args):
        if "--" in args:
            cut = args.index("--")
            ctx.meta["script"] = list(args[cut + 1:])
            args = args[:cut]
        else:
            ctx.meta["script"] = []
        return super().parse_args(ctx, args)


def script_args() -> list[str]:
    return list(click.get_current_context().meta.get("script", []))


def _store_override(ctx, param, value):
    if value is not None:
        ctx.meta.setdefault("train", {})[param.name] = value
    return value


def train_overrides(func):
    """Add one --flag per [train] key (TrainSpec's fields); `overrides()` returns the ones given."""
    from fatpipe.infra.spec import TrainSpec

    for name, field in reversed(TrainSpec.model_fields.items()):
        func = _override_option(name, field.annotation)(func)
    return func


def _override_option(name: str, annotation):
    flag = "--" + name.replace("_", "-")
    options = dict(default=None, expose_value=False, callback=_store_override,
                   help=f"Override [train] {name}.")
    if annotation is bool:
        return click.option(f"{flag}/--no-{name.replace('_', '-')}", name, **options)
    if get_origin(annotation) is Literal:
        return click.option(flag, name, type=click.Choice(get_args(annotation)), **options)
    kind = annotation if annotation in (int, float) else str
    return click.option(flag, name, type=kind, **options)


def overrides() -> dict:
    """The [train] overrides given on the command line."""
    return dict(click.get_current_context().meta.get("train", {}))


def run_options(func):
    """torchrun and node settings: processes per node, restarts, join timeout, the remote Python."""
    options = [
        outputs_option,
        click.option("--nproc-per-node", type=click.IntRange(1, 64), default=None,
                     help="Processes per node (default: gpus_per_node, else 1)."),
        click.option("--max-restarts", type=click.IntRange(0, 100), default=3, show_default=True,
                     help="torchrun restarts of the whole worker group after a failure."),
        click.option("--join-timeout", type=click.IntRange(10, 3600), default=180, show_default=True,
                     help="Seconds torchrun waits for every node to join the rendezvous."),
        remote_python_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def resolve_train(project, overrides: dict):
    """[train] with this run's overrides, validated like the file."""
    from pydantic import ValidationError

    from fatpipe.infra.spec import TrainSpec

    try:
        return TrainSpec.model_validate({**project.train.model_dump(), **overrides})
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "[train]"
        raise ConfigError(f"{flag}: {err['msg'].removeprefix('Value error, ')}") from None


def new_rendezvous(project, outputs, train=None, script=None, run=None, **options):
    """A new run (or the given (id, folder)) with its rendezvous written; returns (rdzv, run_dir).

    `train` and `script` default to this command's [train] overrides and `-- SCRIPT ARGS`;
    `options` are plan_rendezvous's (nproc_per_node, max_restarts, join_timeout_s, remote_python).
    """
    from fatpipe.infra.rendezvous import make_rendezvous
    from fatpipe.infra.runs import new_run

    train = train if train is not None else resolve_train(project, overrides())
    script = script if script is not None else script_args()
    run_id, run_dir = run or new_run(project, outputs.name)
    return make_rendezvous(project, outputs, run_id, run_dir, train=train, script=script, **options), run_dir
