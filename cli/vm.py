"""`fatpipe vm image`, and the hidden `fatpipe vm node-up/node-down` the vm stack's provisioners run
(their values come as FATPIPE_VM_* environment, never as shell text)."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import click

from fatpipe.infra.errors import FatpipeError
from fatpipe.stacks.vm.image import build_image, default_cache
from fatpipe.stacks.vm.inputs import BOOT_KEYS, NODE_KEYS, RATE_KEYS, VM_ENV_PREFIX
from fatpipe.stacks.vm.node import VmNode
from fatpipe.stacks.vm.node import node_down as down
from fatpipe.stacks.vm.node import node_up as up


def image(cache):
    """The body of `fatpipe vm image`; `vm`'s commands are declared in cluster_commands.py."""
    built = build_image(cache or default_cache(), log=lambda m: click.echo(m, err=True))
    click.echo(str(built.disk))


def node_from_env():
    values = {key: os.environ.get(f"{VM_ENV_PREFIX}{key.upper()}") for key in NODE_KEYS}
    missing = [key for key, value in values.items() if value is None]
    if missing:
        raise FatpipeError(f"fatpipe vm: missing {', '.join(VM_ENV_PREFIX + k.upper() for k in missing)}")
    node_dir = Path(values["node_dir"])
    # node-down removes this folder: only ever a node's own folder under the project's state.
    if node_dir.is_absolute() or len(node_dir.parts) != 4 or node_dir.parts[::2] != (".fatpipe", "nodes") \
            or ".." in node_dir.parts:
        raise FatpipeError(f"fatpipe vm: {VM_ENV_PREFIX}NODE_DIR {str(node_dir)!r} is not "
                           ".fatpipe/<cluster>/nodes/<node>")
    boot = {key: os.environ[f"{VM_ENV_PREFIX}{key.upper()}"] for key in (*BOOT_KEYS[:-1], *RATE_KEYS)
            if f"{VM_ENV_PREFIX}{key.upper()}" in os.environ}  # node-up's alone (not the user data)
    try:
        return VmNode(**{**values, **boot, "rtt_ms": float(boot.get("rtt_ms", 0)),
                         "peer_rtt_ms": peer_rtts(boot.get("peer_rtt_ms", "{}")),
                         "peer_gbps": peer_rates(boot.get("peer_gbps", "{}")),
                         "rate_gbit": float(values["rate_gbit"]), "mtu": int(values["mtu"]),
                         "vcpus": int(values["vcpus"]), "memory_mib": int(values["memory_mib"]),
                         "node_dir": node_dir})
    except ValueError as e:
        raise FatpipeError(f"fatpipe vm: a bad FATPIPE_VM_* value ({e})") from None


def peer_map(text: str, variable: str, label: str, unit: str,
             bounds: tuple[float, float]) -> tuple[tuple[str, float], ...]:
    """A FATPIPE_VM_* JSON {peer IP: number} from the stack, checked: it comes from the
    environment, and its values become tc's arguments in the guest."""
    low, high = bounds
    try:
        peers = json.loads(text)
        if not isinstance(peers, dict):
            raise ValueError("not a JSON object")
        for value in peers.values():  # a number within the bounds (NaN and booleans are not)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"{value!r} is not a {label} of {low:g} to {high:g} {unit}")
        checked = tuple((str(ipaddress.IPv4Address(ip)), float(value)) for ip, value in sorted(peers.items()))
    except ValueError as e:
        raise FatpipeError(f"fatpipe vm: {variable} is not {{peer IPv4: {label} {unit}}} ({e})") from None
    return checked


def peer_rtts(text: str) -> tuple[tuple[str, float], ...]:
    """FATPIPE_VM_PEER_RTT_MS, the stack's JSON {peer IP: round trip in ms}, checked."""
    return peer_map(text, "FATPIPE_VM_PEER_RTT_MS", "round trip", "ms", (0, 1000))


def peer_rates(text: str) -> tuple[tuple[str, float], ...]:
    """FATPIPE_VM_PEER_GBPS, the stack's JSON {peer IP: Gbit/s it may send}, checked."""
    return peer_map(text, "FATPIPE_VM_PEER_GBPS", "rate", "Gbit/s", (0.001, 100))


def node_up():
    """The body of `fatpipe vm node-up`."""
    node = node_from_env()
    up(node, os.environ.get("FATPIPE_VM_USER_DATA", ""), log=lambda m: click.echo(m, err=True))
    click.echo(f"{node.name}: booting at {node.ip} ({node.tap}, tbf {node.rate_gbit:g} Gbit/s)")


def node_down():
    """The body of `fatpipe vm node-down`."""
    node = node_from_env()
    down(node, log=lambda m: click.echo(m, err=True))
    click.echo(f"{node.name}: down")
