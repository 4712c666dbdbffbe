"""What a command's declaration needs: the options several commands share, and the command class
that loads the command's body only when it runs (docs/ARCHITECTURE.md, "Imports at the top").

A command is declared (its options and help) in a module that imports click and little else
(`cluster_commands.py`, `run_commands.py`, `train_commands.py`); its body, with the imports it
needs (pydantic's models, rich, ops), lives in the command's own module, named by string as the
root group names the declarations. So `fatpipe <command> --help` imports no body.
"""

from __future__ import annotations

import importlib

import click

from fatpipe.infra.defaults import (
    DEFAULT_ENGINE,
    ENGINES,
    JOIN_TIMEOUT_S,
    MAX_RESTARTS,
    UNREACHABLE_TIMEOUT_S,
)


class BodyCommand(click.Command):
    """A command whose callback is `body` ("module:function"), imported when the command runs."""

    def __init__(self, *args, body: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.body = body

    def invoke(self, ctx):
        self.callback = named(self.body)
        return super().invoke(ctx)


def named(target: str):
    """The function `target` ("module:function") names, its module imported now."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def later(target: str):
    """An option's callback that is `target` ("module:function"), imported when click first calls
    it (while parsing a command that runs; `--help` never does)."""

    def callback(ctx, param, value):
        return named(target)(ctx, param, value)

    return callback


class ScriptCommand(BodyCommand):
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
