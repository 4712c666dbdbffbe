"""Hidden `fatpipe sim node-up/node-down`: what the sim stack's terraform provisioners run."""

from __future__ import annotations

import functools
from pathlib import Path

import click


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
    ]
    for option in reversed(options):
        func = option(func)

    @functools.wraps(func)
    def wrapper(**kwargs):
        from fatpipe.stacks.simnet import SimNode

        return func(SimNode(**kwargs))

    return wrapper


@click.group(hidden=True)
def sim():
    """Make and remove sim nodes (run by terraform's local-exec provisioners)."""


@sim.command("node-up")
@node_options
def node_up(node):
    """Create one sim node and write its ready file."""
    from fatpipe.stacks.simnet import node_up as up

    ready = up(node, log=lambda m: click.echo(m, err=True))
    shaped = f"tbf {ready['rate_gbit']:g} Gbit/s" if ready.get("rate_gbit") else "unshaped"
    click.echo(f"{node.name}: up at {node.ip} on {ready['iface']} ({node.isolation}, {shaped})")


@sim.command("node-down")
@node_options
def node_down(node):
    """Remove one sim node; succeeds when it is already gone."""
    from fatpipe.stacks.simnet import node_down as down

    down(node, log=lambda m: click.echo(m, err=True))
    click.echo(f"{node.name}: down")
