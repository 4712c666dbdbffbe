"""Options and helpers shared by several commands, defined once: one name and default per setting."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Literal, get_args, get_origin

import click
from rich.markup import escape

from fatpipe.infra.defaults import (
    DEFAULT_ENGINE,
    ENGINES,
    JOIN_TIMEOUT_S,
    MAX_RESTARTS,
    UNREACHABLE_TIMEOUT_S,
)
from fatpipe.infra.errors import ConfigError

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


# Read with `given(name)` rather than passed to the command: its parameters stay few.
on_signal_option = click.option(
    "--on-signal", type=click.Choice(["detach", "stop"]), default="detach", show_default=True,
    envvar="FATPIPE_ON_SIGNAL", show_envvar=True, expose_value=False, callback=_store_meta,
    help="What SIGTERM, SIGHUP or a SIGINT without a terminal does to a run that is going: detach (it "
         "goes on on its nodes, exit 76, and --down-after leaves the cluster up) or stop it (as Ctrl-C "
         "typed at the terminal does; --down-after then destroys), for unattended runs.")
force_option = click.option(
    "--force", is_flag=True, expose_value=False, callback=_store_meta,
    help="Go on though a node of the cluster's latest run cannot be reached (its run may still be going there).")


def given(name: str):
    """The value of an option stored for the command (`on_signal`, `force`), None when it has none."""
    return click.get_current_context().meta.get(name)


def pass_project(func=None, *, clusters_optional: bool = False):
    """Hand the command the loaded Project (fatpipe.toml or the embedded default) as `project`.

    `clusters_optional`: the command needs no cluster, so a file with only [train] will do.
    """
    if func is None:
        return functools.partial(pass_project, clusters_optional=clusters_optional)

    @click.pass_context
    @functools.wraps(func)
    def wrapper(ctx: click.Context, *args, **kwargs):
        from fatpipe.infra.project import load_project

        path = (ctx.find_root().obj or {}).get("config_path")
        return ctx.invoke(func, *args, project=load_project(path, clusters_optional), **kwargs)

    return wrapper


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def silence_output() -> None:
    """After the reader of our output went away (a closed pipe): send the rest to /dev/null, so
    that what still has to run (a teardown) runs, and exit raises no second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(devnull, fd)
    os.close(devnull)


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


# An override's parameter is named train_<key>: a command's own option of the same name (launch's
# --timeout is timeout_s) would otherwise share click's slot and overwrite the [train] value.
_OVERRIDE_PREFIX = "train_"


def _store_override(ctx, param, value):
    if value is not None:
        ctx.meta.setdefault("train", {})[param.name.removeprefix(_OVERRIDE_PREFIX)] = value
    return value


def train_overrides(func):
    """Add one --flag per [train] key (TrainSpec's fields); `overrides()` returns the ones given."""
    from fatpipe.infra.trainspec import TrainSpec

    for name, field in reversed(TrainSpec.model_fields.items()):
        func = _override_option(name, field.annotation)(func)
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


def overrides() -> dict:
    """The [train] overrides given on the command line."""
    return dict(click.get_current_context().meta.get("train", {}))


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


def given_run_options():
    """The RunOptions this command was given (`run_options`' flags)."""
    from fatpipe.ops.rdzv.rendezvous import RunOptions

    return RunOptions(**click.get_current_context().meta.get("run_options", {}))


def resolve_train(project, overrides: dict):
    """[train] with this run's overrides, validated like the file (every problem at once); warns
    on stderr about settings that are valid but surely not meant."""
    from pydantic import ValidationError

    from fatpipe.infra.project import error_report, train_warnings
    from fatpipe.infra.trainspec import TrainSpec

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


def approve_node_changes(project, name: str, changes, replace: bool) -> bool:
    """`replace_option`'s question: one line per node the plan would replace, destroy or stop and
    start (stacks.nodeplan), then yes with --replace, else the user's answer on a terminal alone."""
    import sys

    from fatpipe.ops.data.nodeholdings import change_lines

    out = console()
    for line in change_lines(project, name, changes):
        out.print(f"[yellow]{escape(line)}[/]", soft_wrap=True)
    if replace:
        return True
    if not sys.stdin.isatty():
        return False
    return click.confirm(f"Apply this to {name}? What these nodes hold is lost", default=False, err=True)
