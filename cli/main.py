"""The root `fatpipe` group: lazy command loading and one place that turns errors into exits."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

import click

from fatpipe.infra.errors import FatpipeError

from .ending import interrupted_status, interrupted_word, silence_output

# name -> ("module:attribute", one-line help). Help lives here so `fatpipe --help` imports
# no command module (and so no torch, cdktf or provider package).
COMMANDS: dict[str, tuple[str, str]] = {  # in lifecycle order, as `fatpipe --help` lists them
    "up": ("fatpipe.cli.up:up", "Deploy, wait, check the links, train, summarize: one command."),
    "init": ("fatpipe.cli.init:init", "Write a commented fatpipe.toml."),
    "config": ("fatpipe.cli.config:config", "Show the resolved cluster and train settings."),
    "synth": ("fatpipe.cli.synth:synth", "Write each cluster's Terraform JSON; show machines and $/hour."),
    "catalog": ("fatpipe.cli.catalog:catalog",
                "Cheapest machine types per tier; refresh them from the provider's API."),
    "plan": ("fatpipe.cli.plan:plan", "Rank machine types, tiers and node counts for a job by time or cost."),
    "deploy": ("fatpipe.cli.deploy:deploy", "Create the cluster's nodes and write its outputs."),
    "wait": ("fatpipe.cli.wait:wait", "Wait until every node is reachable, booted and tuned."),
    "netcheck": ("fatpipe.cli.netcheck:netcheck", "Prove the links deliver the tier before training."),
    "data": ("fatpipe.cli.data:data", "Prepare a dataset as token shards; stage it on every node, verify it."),
    "rendezvous": ("fatpipe.cli.rendezvous:rendezvous", "Write a run's rendezvous files and torchrun commands."),
    "launch": ("fatpipe.cli.launch:launch", "Run torchrun on every node and stream the logs."),
    "train": ("fatpipe.cli.train:train", "Train the built-in GPT on this machine with torchrun."),
    "status": ("fatpipe.cli.status:status", "Show the cluster's nodes and the latest run."),
    "logs": ("fatpipe.cli.logs:logs", "Print or follow a run's per-node logs."),
    "top": ("fatpipe.cli.top:top", "Watch a running job per node: links, sync time, the straggler."),
    "report": ("fatpipe.cli.report:report", "Draw a run as one HTML page: loss, step split, sync, links."),
    "runs": ("fatpipe.cli.runs:runs", "List a cluster's runs and what each achieved; prune old ones."),
    "pull": ("fatpipe.cli.pull:pull", "Bring files a script wrote on the nodes (its checkpoints) back here."),
    "stop": ("fatpipe.cli.stop:stop", "Stop a run on every node."),
    "down": ("fatpipe.cli.down:down", "Destroy the cluster's nodes."),
    "vm": ("fatpipe.cli.vm:vm", "Build the base image of `vm` clusters (local QEMU VMs, real kernels)."),
}
HIDDEN: dict[str, str] = {
    "sim": "fatpipe.cli.sim:sim",
    "ssh-node": "fatpipe.cli.ssh_node:ssh_node",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name, (HIDDEN.get(name), ""))[0]
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except FatpipeError as e:
            error = click.ClickException(str(e))
            error.exit_code = e.exit_code
            raise error from None
        except KeyboardInterrupt:  # Ctrl-C, or a termination where a command takes it so: no traceback
            click.echo(interrupted_word(), err=True)
            ctx.exit(interrupted_status())
        except BrokenPipeError:  # `fatpipe ... | head`: the reader has what it wanted
            silence_output()
            ctx.exit(141)


def _version() -> str:
    try:
        return version("fatpipe")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-c", "--config", "config_path", type=click.Path(dir_okay=False), envvar="FATPIPE_CONFIG",
    help="Cluster file to read (default ./fatpipe.toml, else the embedded sim cluster).",
)
@click.version_option(package_name="fatpipe", version=_version(), prog_name="fatpipe")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None):
    """fatpipe: stand up a cluster on a fast private network, prove its links, train across it."""
    ctx.obj = {"config_path": config_path}
