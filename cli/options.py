"""Options and helpers shared by several commands, defined once: one name and default per setting."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal, get_args, get_origin

import click
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from fatpipe.infra.defaults import (
    DEFAULT_ENGINE,
    ENGINES,
    JOIN_TIMEOUT_S,
    MAX_RESTARTS,
    UNREACHABLE_TIMEOUT_S,
)
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.project import error_report, load_project, train_warnings
from fatpipe.infra.trainspec import TrainSpec

REMOTE_PYTHON_HELP = ("On ssh nodes, run this interpreter (an image that ships torch) instead of making "
                      "a venv. Env: FATPIPE_REMOTE_PYTHON.")

cluster_argument = click.argument("cluster", required=False)
outputs_option = click.option(
    "--outputs", "outputs_file", type=click.Path(dir_okay=False, exists=True),
    help="Read this outputs file instead of .fatpipe/<cluster>/outputs.json.",
)
remote_python_option = click.option(
    "--remote-python", envvar="FATPIPE_REMOTE_PYTHON", default=None, help=REMOTE_PYTHON_HELP,
)
engine_option = click.option(
    "--engine", type=click.Choice(ENGINES), default=DEFAULT_ENGINE, show_default=True,
    help="What applies the synthesized stack.",
)
yes_option = click.option("-y", "--yes", is_flag=True, help="Do not ask before creating paid cloud resources.")
replace_option = click.option(
    "--replace", is_flag=True,
    help="Go on when the plan replaces, destroys or stops existing nodes (what they hold is lost, their "
         "run ends); without it, deploy asks on a terminal and otherwise stops before changing anything.")
verbose_option = click.option("-v", "--verbose", is_flag=True,
                              help="Show the full output: the deploy engine's, and every node's every line.")
unreachable_option = click.option(
    "--unreachable-timeout", "unreachable_s", type=click.FloatRange(1), default=UNREACHABLE_TIMEOUT_S,
    show_default=True,
    help="Stop following (exit 75) once a node has been out of reach this many seconds; the run goes "
         "on on its nodes and `fatpipe logs -f` reattaches. A lost connection never stops a run. A "
         "node a live run went on without is not waited for: the run ends with the others.",
)

def _store_meta(ctx, param, value):
    ctx.meta[param.name] = value
    return value


# Handed to the command in its `Request` (`pass_request`) rather than as parameters: they stay few.
on_signal_option = click.option(
    "--on-signal", type=click.Choice(["detach", "stop"]), default="detach", show_default=True,
    envvar="FATPIPE_ON_SIGNAL", show_envvar=True, expose_value=False, callback=_store_meta,
    help="What SIGTERM, SIGHUP or a SIGINT without a terminal does to a run that is going: detach (it "
         "goes on on its nodes, exit 76, and --down-after leaves the cluster up) or stop it (as Ctrl-C "
         "typed at the terminal does; --down-after then destroys), for unattended runs.")
force_option = click.option(
    "--force", is_flag=True, expose_value=False, callback=_store_meta,
    help="Go on though a node of the cluster's latest run cannot be reached (its run may still be going there).")


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


# An override's parameter is named train_<key>: a command's own option of the same name (launch's
# --timeout is timeout_s) would otherwise share click's slot and overwrite the [train] value.
_OVERRIDE_PREFIX = "train_"


def _store_override(ctx, param, value):
    if value is not None:
        ctx.meta.setdefault("train", {})[param.name.removeprefix(_OVERRIDE_PREFIX)] = value
    return value


def train_overrides(func):
    """Add one --flag per [train] key (TrainSpec's fields); the Request holds the ones given."""
    for name, declared in reversed(TrainSpec.model_fields.items()):
        func = _override_option(name, declared.annotation)(func)
    return func


def _override_option(name: str, annotation):
    flag, dest = "--" + name.replace("_", "-"), _OVERRIDE_PREFIX + name
    options = dict(default=None, expose_value=False, callback=_store_override,
                   help=f"Override [train] {name}.")
    if annotation is bool:
        return click.option(f"{flag}/--no-{name.replace('_', '-')}", dest, **options)
    if get_origin(annotation) is Literal:
        return click.option(flag, dest, type=click.Choice(get_args(annotation)), **options)
    kind = annotation if annotation in (int, float) else str
    return click.option(flag, dest, type=kind, **options)


max_restarts_option = click.option(
    "--max-restarts", type=click.IntRange(0, 100), default=MAX_RESTARTS, show_default=True,
    help="torchrun restarts of the whole worker group after a failure; the run resumes from its checkpoint.",
)


def run_options(func):
    """torchrun and node settings, handed to the command as one `run_options` (ops' RunOptions)."""
    options = [
        outputs_option,
        click.option("--nproc-per-node", type=click.IntRange(1, 64), default=None, expose_value=False,
                     callback=_store_run_option, help="Processes per node (default: gpus_per_node, else 1)."),
        click.option("--max-restarts", type=click.IntRange(0, 100), default=MAX_RESTARTS, show_default=True,
                     expose_value=False, callback=_store_run_option,
                     help="torchrun restarts of the whole worker group after a failure; the run resumes "
                          "from its checkpoint."),
        click.option("--join-timeout", "join_timeout_s", type=click.IntRange(10, 3600), default=JOIN_TIMEOUT_S,
                     show_default=True, expose_value=False, callback=_store_run_option,
                     help="Seconds torchrun waits for every node to join the rendezvous."),
        click.option("--remote-python", envvar="FATPIPE_REMOTE_PYTHON", default=None, expose_value=False,
                     callback=_store_run_option, help=REMOTE_PYTHON_HELP),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _store_run_option(ctx, param, value):
    ctx.meta.setdefault("run_options", {})[param.name] = value
    return value


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
