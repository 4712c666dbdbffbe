"""The declarations of the commands that set a cluster up and take it down: their options and help.

Each body lives in the command's own module, imported when the command runs (`BodyCommand`), so
`fatpipe <command> --help` loads click and these lines, not pydantic, rich or ops.
"""

from __future__ import annotations

from pathlib import Path

import click

from fatpipe.infra.defaults import P2P_TOOLS, WAIT_TIMEOUT_S
from fatpipe.infra.templates import TEMPLATES

from .declare import (
    BodyCommand,
    cluster_argument,
    engine_option,
    force_option,
    later,
    outputs_option,
    remote_python_option,
    replace_option,
    verbose_option,
    yes_option,
)

# infra.accelerators.ACCELERATORS' keys, without importing it (a unit test keeps them equal)
_ACCELERATORS = ("rtx4090", "t4", "a10g", "l4", "l40s", "a100", "a100-80gb", "h100", "cpu")


@click.command(cls=BodyCommand, body="fatpipe.cli.init:init")
@click.option("--provider", type=click.Choice(sorted(TEMPLATES)), default="sim", show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.option("--add", "add_name", metavar="NAME", default=None,
              help="Append a cluster NAME of --provider to the existing file instead of writing a new one.")
def init():
    """Write a commented fatpipe.toml to start from; with --add, add one more cluster to it."""



@click.command(cls=BodyCommand, body="fatpipe.cli.config:config")
@cluster_argument
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def config():
    """Show the resolved cluster and train settings (all clusters when none is named), and what
    looks valid but surely is not meant."""



@click.command(cls=BodyCommand, body="fatpipe.cli.synth:synth")
@cluster_argument
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def synth():
    """Synthesize the cluster stacks (all when none is named) into cdktf.out/ and summarize them."""



@click.command(cls=BodyCommand, body="fatpipe.cli.catalog:catalog")
@click.argument("provider", type=click.Choice(["aws", "digitalocean"]))
@click.option("--region", help="Refresh the catalog for this region (AWS: required to refresh).")
@click.option("--types", "types", metavar="T1,T2", default="", help="Refresh only these types.")
@click.option("--families", metavar="F1,F2", default="", help="Refresh only these families (c7gn, m7i, ...).")
@click.option("--offline", is_flag=True, help="Only show the catalog in use; call no API.")
@click.option("--top", type=int, default=3, show_default=True, help="Types shown per tier.")
def catalog():
    """Show the cheapest machine types per tier (judged on baseline bandwidth).

    `aws --region R` first refreshes the catalog from DescribeInstanceTypes (boto3, your AWS
    credentials) into .fatpipe/catalog/aws-R.json; `digitalocean` from the sizes API when
    DIGITALOCEAN_TOKEN is set (into digitalocean.json, or digitalocean-R.json with --region).
    A refreshed catalog takes precedence; the lines it prints say what changed.
    """



@click.command(cls=BodyCommand, body="fatpipe.cli.plan:plan")
@click.option("--model", default="124m", show_default=True,
              help="A trainer preset (tiny, small, 124m) or a parameter count (124M, 1.5B).")
@click.option("--tokens", help="Tokens to train on (10B, 2.5B, 350000000). Default: --steps x --batch, else 10B.")
@click.option("--steps", type=int, default=None, help="Optimizer steps (with --batch).")
@click.option("--batch", help="Tokens per optimizer step, all nodes together. Default 524288.")
@click.option("--accelerator", "accel", type=click.Choice(_ACCELERATORS), default=None,
              help="Force one accelerator on every node (sourced tokens/s for GPT-2 124M). Default: "
              "each machine type's own GPUs; cpu: the types without a GPU.")
@click.option("--tokens-per-s", type=float,
              help="Your own tokens/s per GPU (per vCPU with cpu) on GPT-2 124M; without "
              "--accelerator, for every GPU of every type.")
@click.option("--catalog", "providers", multiple=True, type=click.Choice(["aws", "digitalocean"]),
              help="Provider catalogs to rank (repeatable; default: all, none with --link).")
@click.option("--tier", "tiers", multiple=True, type=click.Choice(["1g", "10g", "25g"]),
              help="Tiers to consider (repeatable; default: all).")
@click.option("--link", "links", multiple=True, type=float,
              help="Also plan nodes outside the catalogs with this link in Gbit/s (repeatable).")
@click.option("--span", type=click.Choice(["region", "regions", "internet"]), default="region",
              show_default=True, help="Where the nodes are: one region, several, or reached over the internet "
              "(AWS caps egress out of a region).")
@click.option("--regions", type=int, default=None,
              help="With --span regions: how many regions the nodes split into, evenly (default 2).")
@click.option("--nodes", default="2-8", show_default=True, help="Node count or range, e.g. 8 or 2-8.")
@click.option("--by", type=click.Choice(["time", "cost"]), default="time", show_default=True)
@click.option("--top", type=int, default=3, show_default=True, help="Rows shown, best first.")
@click.option("--auto-periodic", is_flag=True, default=None,
              help="Let comm=auto take DiLoCo/local SGD, as [train] auto_periodic.")
@click.option("--json", "as_json", is_flag=True, help="Print the ranking as JSON.")
@click.option("--write", "write_name", metavar="NAME",
              help="Add the best catalog row to fatpipe.toml as cluster NAME (whole or not at all).")
def plan():
    """Rank machine types, tiers and node counts by predicted step time or cost.

    Compute comes from each type's own GPUs at their sourced throughput (or the one
    --accelerator forces), communication from a ring all-reduce across the nodes over each
    type's baseline bandwidth (capped per flow), and the method from comm=auto's own model. A
    type whose GPU has no sourced figure is listed, not ranked. Nothing is deployed.
    """



@click.command(cls=BodyCommand, body="fatpipe.cli.deploy:deploy")
@cluster_argument
@engine_option
@yes_option
@replace_option
@verbose_option
@force_option
def deploy():
    """Create the cluster's nodes and write its outputs (the input of every later command)."""


@click.command(cls=BodyCommand, body="fatpipe.cli.wait:wait")
@cluster_argument
@click.option("--wait-timeout", "timeout_s", type=click.FloatRange(1), default=WAIT_TIMEOUT_S, show_default=True,
              help="Seconds to wait for every node (as `up --wait-timeout`).")
@outputs_option
def wait():
    """Wait until every node answers, has finished booting, and reads back the tier's sysctls."""



@click.command(cls=BodyCommand, body="fatpipe.cli.netcheck:netcheck")
@cluster_argument
@click.option("--min-fraction", type=click.FloatRange(0, 1, min_open=True), default=0.8, show_default=True,
              help="Pass when busbw at the largest size and every pair reach this fraction of the tier.")
@click.option("--no-gate", is_flag=True, help="Report only: exit 0 even when the links fall short.")
@click.option("--max-size", default=None, callback=later("fatpipe.cli.netcheck:size_value"),
              help="Largest all-reduce of the sweep, e.g. 64M  [default: 256M; with --quick from the tier]")
@click.option("--min-size", default=None, callback=later("fatpipe.cli.netcheck:size_value"),
              help="Smallest all-reduce  [default: 1M; with --quick the largest size only]")
@click.option("--quick", is_flag=True,
              help="One all-reduce size the tier makes rate-bound (32M at 1 Gbit/s on 4 nodes), few iterations, "
                   "one 1 s multi-stream p2p run per node: the busbw the gate and comm=auto read "
                   "(`up --netcheck quick`).")
@click.option("--streams", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Parallel TCP streams of the multi-stream p2p test.")
@click.option("--p2p-seconds", type=click.FloatRange(1, 60), default=3.0, show_default=True,
              help="Length of each p2p run.")
@click.option("--p2p-tool", type=click.Choice(P2P_TOOLS), default="auto", show_default=True,
              help="auto: iperf3 where every node has it, else the built-in socket test.")
@click.option("--pairs", is_flag=True,
              help="Also every node pair, in rounds of pairs that share no node: throughput, latency "
                   "and jitter as a matrix naming the worst link; each pair is gated too.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=None,
              help="Stop the benchmark after this many seconds  [default: estimated from the sizes and the "
                   "tier; slow nodes, such as emulated VMs on a busy host, may need more]")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Run folder for netcheck.json (default: a new one under .fatpipe/<cluster>/runs/).")
@outputs_option
@remote_python_option
@click.option("-v", "--verbose", is_flag=True, help="Stream every node's output.")
@force_option
def netcheck():
    """Measure all-reduce busbw, node-to-node TCP and latency on every node; exit 1 below the bar."""



@click.command(cls=BodyCommand, body="fatpipe.cli.down:down")
@cluster_argument
@engine_option
@verbose_option
def down():
    """Destroy every node of the cluster (a sim cluster's namespaces and bridge too).

    Only this project's resources: a sim namespace of the same name that another project folder
    deployed is left alone and named. Ctrl-C asks before abandoning the teardown.
    """



@click.group()
def vm():
    """Local QEMU VMs booted with a cloud's own user data (provider = "vm")."""


@vm.command("image", cls=BodyCommand, body="fatpipe.cli.vm:image")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder of cached images (default: FATPIPE_VM_CACHE, else ~/.cache/fatpipe/vm-image).")
def image():
    """Build the base image offline from this machine's apt mirror (cached by its recipe's hash)."""


@vm.command("node-up", hidden=True, cls=BodyCommand, body="fatpipe.cli.vm:node_up")
def node_up():
    """Start one VM (run by the vm stack's provisioner)."""


@vm.command("node-down", hidden=True, cls=BodyCommand, body="fatpipe.cli.vm:node_down")
def node_down():
    """Remove one VM and everything it had; succeeds when it is already gone."""
