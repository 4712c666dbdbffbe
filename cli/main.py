"""The root `fatpipe` group: lazy command loading and one place that turns errors into exits."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

import click

from fatpipe.infra.errors import FatpipeError

from .ending import interrupted_status, interrupted_word, silence_output

# name -> ("module:attribute", one-line help). Help lives here so `fatpipe --help` imports
# no command module (and so no torch, cdktf or provider package). The attribute is the command's
# declaration (cli/*_commands.py: options and help); its body loads when it runs (cli/declare.py).
COMMANDS: dict[str, tuple[str, str]] = {  # in lifecycle order, as `fatpipe --help` lists them
    "up": ("fatpipe.cli.train_commands:up", "Deploy, wait, check the links, train, summarize: one command."),
    "init": ("fatpipe.cli.cluster_commands:init", "Write a commented fatpipe.toml."),
    "config": ("fatpipe.cli.cluster_commands:config", "Show the resolved cluster and train settings."),
    "synth": ("fatpipe.cli.cluster_commands:synth", "Write each cluster's Terraform JSON; show machines and $/hour."),
    "catalog": ("fatpipe.cli.cluster_commands:catalog",
                "Cheapest machine types per tier; refresh them from the provider's API."),
    "plan": ("fatpipe.cli.cluster_commands:plan",
             "Rank machine types, tiers and node counts for a job by time or cost."),
    "deploy": ("fatpipe.cli.cluster_commands:deploy", "Create the cluster's nodes and write its outputs."),
    "wait": ("fatpipe.cli.cluster_commands:wait", "Wait until every node is reachable, booted and tuned."),
    "netcheck": ("fatpipe.cli.cluster_commands:netcheck", "Prove the links deliver the tier before training."),
    "data": ("fatpipe.cli.run_commands:data", "Prepare a dataset as token shards; stage it on every node, verify it."),
    "rendezvous": ("fatpipe.cli.train_commands:rendezvous", "Write a run's rendezvous files and torchrun commands."),
    "launch": ("fatpipe.cli.train_commands:launch", "Run torchrun on every node and stream the logs."),
    "train": ("fatpipe.cli.train_commands:train", "Train the built-in GPT on this machine with torchrun."),
    "status": ("fatpipe.cli.run_commands:status", "Show the cluster's nodes and the latest run."),
    "logs": ("fatpipe.cli.run_commands:logs", "Print or follow a run's per-node logs."),
    "top": ("fatpipe.cli.run_commands:top", "Watch a running job per node: links, sync time, the straggler."),
    "report": ("fatpipe.cli.run_commands:report", "Draw a run as one HTML page: loss, step split, sync, links."),
    "runs": ("fatpipe.cli.run_commands:runs", "List a cluster's runs and what each achieved; prune old ones."),
    "pull": ("fatpipe.cli.run_commands:pull", "Bring files a script wrote on the nodes (its checkpoints) back here."),
    "stop": ("fatpipe.cli.run_commands:stop", "Stop a run on every node."),
    "down": ("fatpipe.cli.cluster_commands:down", "Destroy the cluster's nodes."),
    "vm": ("fatpipe.cli.cluster_commands:vm", "Build the base image of `vm` clusters (local QEMU VMs, real kernels)."),
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
