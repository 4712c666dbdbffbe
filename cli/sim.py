"""Hidden `fatpipe sim node-up/node-down`: what the sim stack's terraform provisioners run."""

from __future__ import annotations

import functools
import ipaddress
from pathlib import Path

import click

from fatpipe.infra.clusters import SimCluster
from fatpipe.infra.project import project_id_at
from fatpipe.ops.reach.profile import SshHost, apply_profile
from fatpipe.stacks.node_profile import profile_plan
from fatpipe.stacks.providers import provider_for
from fatpipe.stacks.sim.net import SimNode
from fatpipe.stacks.sim.net import node_down as down
from fatpipe.stacks.sim.net import node_up as up
from fatpipe.stacks.sim.sshd import cluster_key, host_address, start_sshd


def node_options(func):
    """The node as recorded in its terraform_data input; node-up and node-down take the same set."""
    options = [
        click.option("--cluster", required=True),
        click.option("--index", type=int, required=True),
        click.option("--isolation", type=click.Choice(["netns", "loopback"]), required=True),
        click.option("--address", required=True, help="IP/prefix, e.g. 10.42.0.10/24"),
        click.option("--tier", required=True),
        click.option("--rate-gbit", type=float, required=True),
        click.option("--node-dir", type=click.Path(path_type=Path), required=True),
        click.option("--netns", default=""),
        click.option("--bridge", default=""),
        click.option("--host-if", default=""),
        click.option("--transport", type=click.Choice(["netns", "ssh", "local"]), default="netns"),
        click.option("--firewall", type=bool, default=True, help="transport ssh: the host firewall."),
        click.option("--nodes", type=int, default=1,
                     help="transport ssh: the cluster's nodes, whom the firewall trusts."),
        click.option("--rdzv-port", type=int, default=29400, help="transport ssh: where the run's ports start."),
        click.option("--region", type=int, default=-1, help="Across regions: the node's region."),
        click.option("--cross-gbit", type=float, default=0.0, help="Across regions: the link's rate."),
        click.option("--flow-gbit", type=float, default=0.0, help="Across regions: each flow's cap (0: none)."),
        click.option("--project-id", default=None,
                     help="Whose node it is (default: the working folder's .fatpipe/project-id)."),
    ]
    for option in reversed(options):
        func = option(func)

    @functools.wraps(func)
    def wrapper(transport, firewall, nodes, rdzv_port, **kwargs):
        # terraform runs the provisioners in the project folder (the stack's working_dir)
        kwargs["project_id"] = kwargs["project_id"] or project_id_at(Path.cwd())
        # Over ssh the node is a bare machine: the node profile tunes it through the ssh path.
        return func(SimNode(**kwargs, tune=transport != "ssh"), transport, (firewall, nodes, rdzv_port))

    return wrapper


@click.group(hidden=True)
def sim():
    """Make and remove sim nodes (run by terraform's local-exec provisioners)."""


@sim.command("node-up")
@node_options
def node_up(node, transport, firewall):
    """Create one sim node and write its ready file; with transport ssh, start its sshd and tune
    it over SSH as a rented machine is tuned."""
    log = lambda m: click.echo(m, err=True)  # noqa: E731
    ready = up(node, log=log)
    if transport == "ssh":
        try:
            tune_over_ssh(node, *firewall)
        except BaseException:
            down(node, log)
            raise
    shaped = f"tbf {ready['rate_gbit']:g} Gbit/s" if ready.get("rate_gbit") else "unshaped"
    click.echo(f"{node.name}: up at {node.ip} on {ready['iface']} ({node.isolation}, {shaped}, {transport})")


def tune_over_ssh(node, firewall: bool = True, nodes: int = 1, rdzv_port: int = 29400) -> None:
    """sshd in the node's namespace, then the node profile through the ssh provider's path (its
    firewall trusting the cluster's `nodes`, numbered from .10 as the sim numbers them)."""
    state_dir = node.node_dir.parent.parent  # .fatpipe/<cluster>
    key = cluster_key(state_dir, node.home_bridge)
    host_address(node.home_bridge, node.address)
    start_sshd(node.netns, node.ip, node.node_dir, key)
    network = str(ipaddress.IPv4Interface(node.address).network)
    spec = SimCluster(provider="sim", name=node.cluster, tier=node.tier, private_cidr=network, nodes=nodes,
                      rdzv_port=rdzv_port, firewall=firewall)
    sim = provider_for("sim")
    profile = profile_plan(spec, sim.mtu, sim.nccl_env(spec), packages=False)
    host = SshHost(node.name, node.ip, 22, "root", str(key))
    apply_profile(host, {**profile, "private_ip": node.ip}, state_dir / "known_hosts")


@sim.command("node-down")
@node_options
def node_down(node, transport, firewall):  # firewall: node-up's option, unused here
    """Remove one sim node; succeeds when it is already gone."""
    down(node, log=lambda m: click.echo(m, err=True))
    click.echo(f"{node.name}: down")
