"""What the host firewall of machines fatpipe did not make trusts (docs/ARCHITECTURE.md, "The node firewall").

The nodes reach every port of each other; the rest of the world only SSH. A declared private
network reaches every port but the run's (`run_ports`): the rendezvous store unpickles what it
reads, torchft's Lighthouse and Manager stop a replica on request and its checkpoint server hands
out the weights, so whoever else shares the network must not reach them. And the private network
must really be private: an address outside the private ranges would open the rest to whoever
holds that range.
"""

from __future__ import annotations

import ipaddress

from .defaults import RUN_PORTS_PER_NODE

# RFC 1918, and RFC 6598's shared space (carrier-grade NAT, and overlay networks such as Tailscale).
PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in
                       ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"))


def in_private_range(value: str) -> bool:
    """Whether an address or network lies wholly inside one of PRIVATE_RANGES."""
    net = ipaddress.IPv4Network(value, strict=False)
    return any(net.subnet_of(private) for private in PRIVATE_RANGES)


def public_address_problem(what: str, value: str) -> str:
    """The one line refusing `value` (named `what`) outside the private ranges."""
    ranges = ", ".join(str(n) for n in PRIVATE_RANGES)
    return (f"{what} {value} is outside the private ranges ({ranges}): the host firewall lets the "
            "private network reach the rendezvous and training ports, so a public range would open "
            "them to the internet; set public_private_ips = true if this really is your private network")


def trusted_sources(cluster) -> list[str]:
    """The sources a node lets reach every port but the run's (`run_ports`, the nodes' alone): the
    `private_cidr` the cluster file declares (or the network fatpipe makes), else each node's own
    address (/32, IPv6 /128) and no more. A network
    computed to hold the nodes would also hold whoever shares the provider's private network or
    the tailnet with them; so would `private_cidr` where public addresses are the private network."""
    if getattr(cluster, "public_private_ips", False) or not cluster.private_cidr:
        return member_sources(cluster)
    return [cluster.private_cidr]


def member_sources(cluster) -> list[str]:
    """Each node's own addresses as /32s (IPv6 /128), the only sources of the run's ports: its
    private_ip, and the IP address SSH reaches it at where that lies in the private network too
    (a node whose private_ip is a second address there sends from its first: the kernel picks
    the source address by route, and torch, gloo and NCCL bind none)."""
    addresses = [cluster.private_ip(i) for i in range(cluster.nodes)]
    network = ipaddress.ip_network(cluster.node_network)
    for host in getattr(cluster, "hosts", []):
        try:
            ip = ipaddress.ip_address(host.address)
        except ValueError:  # a host name or an ~/.ssh/config alias
            continue
        if ip in network and str(ip) not in addresses:
            addresses.append(str(ip))
    return [ipaddress.ip_network(address).with_prefixlen for address in addresses]


def run_ports(cluster) -> list[int]:
    """[first, last] of the ports fatpipe's runs listen on from `rdzv_port` (RUN_PORTS_PER_NODE a
    node). torchft's Manager and checkpoint server, gloo's and NCCL's sockets listen on ephemeral
    ports: the node firewall reads the node's own ephemeral range and guards it the same way."""
    return [cluster.rdzv_port, min(cluster.rdzv_port + RUN_PORTS_PER_NODE * cluster.nodes, 65536) - 1]


def firewall_plan(cluster) -> dict | None:
    """What the node firewall (node/hostfirewall.py) is given; None where the cluster opts out."""
    if not getattr(cluster, "firewall", False):
        return None
    return {"trusted": trusted_sources(cluster), "members": member_sources(cluster), "run_ports": run_ports(cluster)}


def trust_summary(cluster) -> str | None:
    """One line for `fatpipe config`: what the host firewall lets reach every port; None where
    fatpipe installs no host firewall (clouds: their own security group or firewall)."""
    installs = getattr(cluster, "firewall", False) and getattr(cluster, "transport", "ssh") == "ssh"
    if not installs:
        return None
    sources = trusted_sources(cluster)
    if sources == [cluster.private_cidr]:
        first, last = run_ports(cluster)
        return (f"the private network {cluster.private_cidr}, but only the nodes reach the run's ports "
                f"({first}-{last} and the ephemeral range), and SSH from anywhere")
    return f"each node's own address ({', '.join(sources)}), and SSH from anywhere; set private_cidr to trust a network"
