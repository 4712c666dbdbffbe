"""The declarations of the commands that move data and watch, list, fetch or stop runs: their
options and help.

Each body lives in the command's own module, imported when the command runs (`BodyCommand`), so
`fatpipe <command> --help` loads click and these lines, not pydantic, rich or ops.
"""

from __future__ import annotations

import importlib

import click

from .declare import BodyCommand, cluster_argument, outputs_option, unreachable_option

# name -> ("module:attribute", one-line help): add a data subcommand here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("fatpipe.cli.dataprep:prepare", "Text into token shards the trainer reads (llm.c format)."),
    "push": ("fatpipe.cli.data:push", "Stage [data] on every node: once over the uplink, then node to node "
                                      "(a remote source: each node fetches it)."),
    "verify": ("fatpipe.cli.data:verify", "Check every node's data against the manifest."),
}


class LazyData(click.Group):
    """`data`'s subcommands, each imported from its module when named (none for `data --help`)."""

    targets = {name: target for name, (target, _) in SUBCOMMANDS.items()}

    def list_commands(self, ctx):
        return list(SUBCOMMANDS)

    def get_command(self, ctx, name):
        if name not in SUBCOMMANDS:
            return None
        module, attr = SUBCOMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_text) for name, (_, help_text) in SUBCOMMANDS.items()])


@click.group(cls=LazyData)
def data():
    """Your dataset: prepared as token shards, staged on every node over the private links,
    verified by hash."""


@click.command(cls=BodyCommand, body="fatpipe.cli.status:status")
@cluster_argument
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def status():
    """Show the cluster's nodes (and whether each is ready) and the latest run's state.

    The latest run is the last one launched (else the newest with logs); once the cluster is
    down, its nodes' recorded exit statuses and last step tell how it ended.
    """


@click.command(cls=BodyCommand, body="fatpipe.cli.logs:logs")
@cluster_argument
@click.option("--run", "run_id", default=None, help="Which run (default: the latest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until every node's process has exited.")
@click.option("-n", "--node", "node_names", multiple=True, help="Only this node (repeatable).")
@unreachable_option
@click.option("-v", "--verbose", is_flag=True,
              help="Every line (third-party logging; under live, each node's step lines when following).")
def logs():
    """Print every node's log, each line prefixed with the node's name.

    The run is the last one launched (else the newest with logs). With -f, reattach to a running
    run (Ctrl-C detaches; the run goes on). Once the cluster is down, the logs kept here. A run
    that has ended closes with how it ended: the failure line `launch` prints, and its exit status.
    A dropped connection is resumed where it was; a node out of reach past --unreachable-timeout
    ends the follow with exit 75 (the run goes on).
    """


@click.command(cls=BodyCommand, body="fatpipe.cli.top:top")
@cluster_argument
@click.option("--run", "run_id", default=None, help="Which run (default: the latest).")
@click.option("--once", is_flag=True, help="Print one view and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the view as JSON (one view: implies --once).")
@click.option("--interval", type=click.FloatRange(min=0.5, max=60), default=1.5, show_default=True,
              help="Seconds between refreshes.")
def top():
    """Per node: link use against the tier, tx/rx, step and sync time p50/p95 over the last
    window, and a mark on the straggler with the reason; the run's newest events below.

    It reads the files the trainer's rank 0 writes every node_metrics_every steps (nodes.jsonl,
    events.jsonl), on the node of rank 0 over the cluster's transport for ssh and cloud clusters: it
    never slows training. Ctrl-C leaves; the run goes on.
    """


@click.command(cls=BodyCommand, body="fatpipe.cli.report:report")
@cluster_argument
@click.option("--run", "run_id", default=None, help="Which run (default: the latest).")
def report():
    """Draw the run: loss, step time split into compute and exposed communication, sync latency,
    link use against the tier, the netcheck sweep, the comm decision, restarts and failures."""


class DefaultToList(click.Group):
    """`fatpipe runs [CLUSTER]` means `fatpipe runs list [CLUSTER]`: a name that is no subcommand is a cluster."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultToList)
def runs():
    """List a cluster's runs (`fatpipe runs [CLUSTER]`), prune old ones (`fatpipe runs prune`), or pull
    one's results from its nodes (`fatpipe runs pull`)."""


@runs.command("list", cls=BodyCommand, body="fatpipe.cli.runs:list_runs")
@cluster_argument
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def runs_list():
    """Every run, oldest first: outcome, steps, final loss, size on disk; * marks the latest."""

@runs.command("prune", cls=BodyCommand, body="fatpipe.cli.runs:prune")
@cluster_argument
@click.option("--keep", type=click.IntRange(0), required=True, help="How many of the newest runs to keep.")
@click.option("--checkpoints", "checkpoints_only", is_flag=True,
              help="Remove only the older runs' checkpoints/ (the bulk), keeping their logs and metrics.")
def runs_prune():
    """Remove all but the newest N runs; never the latest, nor one still running."""

@runs.command("pull", cls=BodyCommand, body="fatpipe.cli.pullrun:pull")
@click.argument("names", nargs=-1, required=True, metavar="[CLUSTER] RUN")
@click.option("--checkpoints", is_flag=True,
              help="Bring the run's checkpoints/ too (they stay on the nodes otherwise); prints their size first.")
def runs_pull():
    """Bring a run's results (logs, metrics, summary, events) back from its nodes; RUN may be `latest`.

    The nodes keep everything: a pull never deletes there, and goes through a partial folder
    here, so a failed one (named, exit 1) leaves the run folder as it was.
    """


@click.command(cls=BodyCommand, body="fatpipe.cli.pull:pull")
@click.argument("names", nargs=-1, required=True, metavar="[CLUSTER] PATH...")
@click.option("--node", "node_names", multiple=True, metavar="NAME",
              help="Pull from this node (repeatable; default: the node that ran rank 0 in the latest run).")
@click.option("--all", "all_nodes", is_flag=True, help="Pull from every node, into DIR/<node>/PATH.")
@click.option("--to", "to", type=click.Path(file_okay=False), default=None,
              help="Land in DIR/PATH (default: PATH in the local project).")
@click.option("--force", is_flag=True, help="Replace a local copy that is already there (once the new one is whole).")
@outputs_option
def pull():
    """Copy PATH (relative to the node's project folder: a file or a folder) from the node that
    ran rank 0 in the latest run (node 0 before any run), or the named nodes, into the local
    project over the cluster's own transport.

    The copy lands in a partial folder and is renamed into place only when complete, so a failed
    pull (one line, exit 1) leaves the local side as it was; the nodes keep their files.
    """


@click.command(cls=BodyCommand, body="fatpipe.cli.stop:stop")
@cluster_argument
@click.option("--run", "run_id", default=None, help="Which run (default: the latest).")
def stop():
    """Signal the run's torchrun on every node, wait for it to wind down, kill what is left, and
    bring back what the nodes wrote (checkpoints stay there: `fatpipe runs pull`) and `[run] pull`'s
    paths from the node that ran rank 0.

    On a cluster that is down nothing can run: it says so, with how the run ended as its folder
    recorded it.
    """
