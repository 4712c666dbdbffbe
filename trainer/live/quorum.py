"""The live run's quorum rule and the Lighthouse's addresses: what the operator's rendezvous and
the node's Lighthouse (`lighthouse`) and Manager (`manager`) agree on, without the relay's asyncio
or torchft on the operator's import path."""

from __future__ import annotations

import ipaddress


def bind_address(host: str, port: int) -> str:
    """host:port as the Lighthouse binds it; an IPv6 address in brackets. ValueError names a
    host that is no IP address or not one machine's (every interface, a group)."""
    ip = one_host_ip(host)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def one_host_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """`text` as one machine's IP address; ValueError says why it is not (infra.hostvalues'
    rule: the trainer imports nothing of fatpipe's beyond itself, a unit test ties the two)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None
    if ip.is_unspecified:
        raise ValueError(f"{ip} is the unspecified address: a server bound to it listens on every interface")
    if ip.is_multicast:
        raise ValueError(f"{ip} is a multicast address, not one machine's")
    if ip.version == 4 and ip.is_reserved:
        raise ValueError(f"{ip} is a reserved address (the broadcast address among them), not one machine's")
    return ip


# From this many nodes on, a majority is left when one is lost: every node runs a Lighthouse
# and a quorum needs a majority (`majority`); below it, node 0's Lighthouse alone, asking for 1.
STANDBY_MIN_NODES = 3


def majority(nodes: int) -> int:
    """The replica groups a quorum (and a commit) needs: a majority of the cluster's nodes from
    STANDBY_MIN_NODES on (two Lighthouses may each form a quorum, but a step commits only after
    an all-reduce across its whole quorum, and two majorities share a node); 1 below that."""
    return nodes // 2 + 1 if nodes >= STANDBY_MIN_NODES else 1


def address(text: str) -> tuple[str, int]:
    """IP:PORT (an IPv6 address in brackets) as (ip, port); ValueError names a bad one."""
    host, _, port = text.rpartition(":")
    ip = one_host_ip(host.strip("[]"))
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} has no port 1-65535")
    return str(ip), int(port)
