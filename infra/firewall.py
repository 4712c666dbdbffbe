"""What the host firewall of machines fatpipe did not make trusts (docs/ARCHITECTURE.md, "The node firewall").

The private network reaches every port of a node (rendezvous, gloo/NCCL); the rest of the world
only SSH. So the private network must really be private: an address outside the private ranges
would open the rendezvous store, which unpickles what it reads, to whoever holds that range.
"""

from __future__ import annotations

import ipaddress

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
    """The sources a node lets reach every port: the `private_cidr` the cluster file declares (or
    the network fatpipe makes), else each node's own address (/32, IPv6 /128) and no more. A network
    computed to hold the nodes would also hold whoever shares the provider's private network or
    the tailnet with them; so would `private_cidr` where public addresses are the private network."""
    if getattr(cluster, "public_private_ips", False) or not cluster.private_cidr:
        return [ipaddress.ip_network(cluster.private_ip(i)).with_prefixlen for i in range(cluster.nodes)]
    return [cluster.private_cidr]


def trust_summary(cluster) -> str | None:
    """One line for `fatpipe config`: what the host firewall lets reach every port; None where
    fatpipe installs no host firewall (clouds: their own security group or firewall)."""
    installs = getattr(cluster, "firewall", False) and getattr(cluster, "transport", "ssh") == "ssh"
    if not installs:
        return None
    sources = trusted_sources(cluster)
    if sources == [cluster.private_cidr]:
        return f"the private network {cluster.private_cidr}, and SSH from anywhere"
    return f"each node's own address ({', '.join(sources)}), and SSH from anywhere; set private_cidr to trust a network"
