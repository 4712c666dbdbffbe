"""The declarations of the commands that start a run: their options and help, with one --flag
per [train] key.

Each body lives in the command's own module, imported when the command runs (`ScriptCommand`,
`BodyCommand`), so `fatpipe <command> --help` loads click, [train]'s model and these lines, not
the project's other models, rich or ops.
"""

from __future__ import annotations

from typing import Literal, get_args, get_origin

import click

from fatpipe.infra.defaults import WAIT_TIMEOUT_S
from fatpipe.infra.trainspec import TrainSpec

from .declare import (
    BodyCommand,
    ScriptCommand,
    cluster_argument,
    engine_option,
    force_option,
    max_restarts_option,
    on_signal_option,
    replace_option,
    run_options,
    unreachable_option,
    verbose_option,
    yes_option,
)

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


@click.command(cls=ScriptCommand, body="fatpipe.cli.up:up")
@cluster_argument
@engine_option
@yes_option
@replace_option
@click.option("--down-after", is_flag=True,
              help="Destroy the cluster at the end: once every node has recorded its exit (success or "
                   "failure), or on a stop you ask for (Ctrl-C at the terminal; a termination under "
                   "--on-signal stop). A run still going on is never destroyed: the cluster stays up.")
@on_signal_option
@force_option
@click.option("--netcheck", "netcheck_mode", type=click.Choice(["full", "quick", "off"]), default="full",
              show_default=True,
              help="The link check before training: the full sweep, a quick one (as `netcheck --quick`), or off.")
@click.option("--no-gate", is_flag=True, help="Train even when netcheck finds the links below the tier.")
@click.option("--netcheck-timeout", type=click.FloatRange(1), default=None,
              help="Stop the link check after this many seconds (as `netcheck --timeout`).")
@click.option("--wait-timeout", type=click.FloatRange(1), default=WAIT_TIMEOUT_S, show_default=True,
              help="Seconds to wait for the nodes to become ready.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=None,
              help="Stop the training run after this many seconds.")
@unreachable_option
@train_overrides
@run_options
@verbose_option
def up():
    """Stand the cluster up, prove its links, train across it and summarize, in one command.

    Everything after `--` is your torchrun script and its arguments; without it the built-in
    trainer runs with [train] and the overrides given here.
    """


@click.command(cls=ScriptCommand, body="fatpipe.cli.rendezvous:rendezvous")
@cluster_argument
@train_overrides
@run_options
def rendezvous():
    """Write rendezvous.json, node-<rank>.env and node-<rank>.sh for a new run.

    Everything after `--` is your torchrun script and its arguments; without it, the
    built-in trainer runs with the [train] settings (and the overrides given here). The run
    becomes the latest (what `launch --run`, status and logs mean): it exists to be launched,
    by `fatpipe launch --run ID` or by hand on each node.
    """


@click.command(cls=ScriptCommand, body="fatpipe.cli.launch:launch")
@cluster_argument
@click.option("--run", "run_id", default=None,
              help="Start this run's rendezvous (from `fatpipe rendezvous`) instead of a new one.")
@train_overrides
@run_options
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=None,
              help="Stop every node after this many seconds (exit 124).")
@click.option("--detach", is_flag=True, help="Start and return; follow later with `fatpipe logs -f`.")
@click.option("--rejoin", "rejoin", metavar="NODE", default=None,
              help="Start NODE again in the latest run, live (fault_tolerance = \"live\"), and return.")
@unreachable_option
@on_signal_option
@force_option
@click.option("-v", "--verbose", is_flag=True,
              help="Show every node's every line (third-party logging; under live, each node's steps).")
def launch():
    """Sync, start torchrun on every node, stream the logs; exit with the worst node's status.

    Everything after `--` is your torchrun script and its arguments (e.g. `-- train.py --lr 3e-4`);
    without it, the built-in trainer runs with [train] and the overrides given here. Ctrl-C typed
    at the terminal stops the run on every node. A termination (SIGTERM, SIGHUP) lets go of it:
    exit 76, the run goes on (unless --on-signal stop). A lost connection does not stop it either:
    the follow reconnects, and past --unreachable-timeout exits 75 while the run goes on
    (`fatpipe logs -f` reattaches).
    `--rejoin NODE` starts one node of a live run again (one whose restarts ran out, or made
    again by `fatpipe deploy`) and returns once it is started.
    """


@click.command(cls=BodyCommand, body="fatpipe.cli.train:train")
@click.option("--nproc-per-node", type=click.IntRange(1, 64), default=None,
              help="Processes to start (default: one per GPU, else 1).")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Run folder (default .fatpipe/_local/runs/<run-id>/ beside the cluster file).")
@max_restarts_option
@train_overrides
def train():
    """Train the built-in GPT here with [train] and the overrides given; exit with torchrun's status.

    Metrics, summary.json and checkpoints land in the run folder; a netcheck.json placed there
    is what comm = "auto" reads instead of probing the link.
    """
