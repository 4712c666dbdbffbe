"""The DigitalOcean cluster construct: a VPC, droplets tagged as members, and a firewall keyed on that tag.

The API token comes from DIGITALOCEAN_TOKEN at apply time; it never enters the JSON.
"""

from __future__ import annotations

from cdktf import TerraformIterator, TerraformLocal, Token
from cdktf_cdktf_provider_digitalocean.droplet import Droplet
from cdktf_cdktf_provider_digitalocean.firewall import (
    Firewall,
    FirewallInboundRule,
    FirewallOutboundRule,
)
from cdktf_cdktf_provider_digitalocean.provider import DigitaloceanProvider
from cdktf_cdktf_provider_digitalocean.ssh_key import SshKey
from cdktf_cdktf_provider_digitalocean.tag import Tag
from cdktf_cdktf_provider_digitalocean.vpc import Vpc

from fatpipe.infra.catalog import MachineType

from ..literals import literal
from .construct import ClusterConstruct

PROVIDER_SOURCE = "registry.terraform.io/digitalocean/digitalocean"
ANYWHERE = ["0.0.0.0/0", "::/0"]


class DigitalOceanClusterConstruct(ClusterConstruct):
    """The cluster's DigitalOcean resources; `vpc`, `tag`, `firewall`, `nodes` are what it built."""

    def __init__(self, scope, id: str, *, cluster, size: MachineType, user_data: str, project_id: str):
        super().__init__(scope, id)
        self.cluster = cluster
        # Account-wide names carry the project id: two projects' `demo` clusters never collide.
        self.unique_name = unique = literal(f"fatpipe-{cluster.name}-{project_id}")
        DigitaloceanProvider(scope, "digitalocean")
        # A fully qualified source lets both terraform and tofu apply the JSON (opentofu#2402).
        scope.add_override("terraform.required_providers.digitalocean.source", PROVIDER_SOURCE)
        self.vpc = Vpc(self, "vpc", name=unique, region=cluster.region,
                       ip_range=cluster.private_cidr, description=literal(f"fatpipe cluster {cluster.name}"))
        fingerprint = cluster.ssh_key_fingerprint or SshKey(
            self, "key", name=unique, public_key=literal(cluster.public_key)).fingerprint
        self.tag = Tag(self, "members", name=unique)
        self.firewall = self._firewall()
        self.user_data = TerraformLocal(self, "user_data", literal(user_data))
        names = [cluster.node_name(i) for i in range(cluster.nodes)]
        # One resource with for_each over the node names: synth time stays flat in the node count.
        nodes = TerraformIterator.from_list(names)
        self.nodes = Droplet(
            self, "nodes",
            for_each=nodes,
            name=Token.as_string(nodes.key),
            image=cluster.image,
            size=size.name,
            region=cluster.region,
            vpc_uuid=self.vpc.id,
            ssh_keys=[fingerprint],
            tags=[self.tag.id],
            user_data=self.user_data.as_string,
            ipv6=False,
            monitoring=True,  # the metrics agent: bandwidth graphs per droplet
        )
        # DigitalOcean assigns VPC addresses itself: the private IPs are known after apply.
        self.output = cluster.output([
            {"name": name, "public_ip": f'${{digitalocean_droplet.nodes["{name}"].ipv4_address}}',
             "private_ip": f'${{digitalocean_droplet.nodes["{name}"].ipv4_address_private}}',
             "transport": "ssh"}
            for name in names
        ])

    def _firewall(self) -> Firewall:
        """SSH from `ssh_cidr`; all TCP/UDP/ICMP between members; out only what nodes need."""
        tag = self.tag.name
        # Struct classes, not dicts: jsii passes dicts inside lists through with their keys as
        # written, and snake_case keys would silently vanish from the JSON.
        inbound = [
            FirewallInboundRule(protocol="tcp", port_range="22", source_addresses=[self.cluster.ssh_cidr]),
            FirewallInboundRule(protocol="tcp", port_range="1-65535", source_tags=[tag]),
            FirewallInboundRule(protocol="udp", port_range="1-65535", source_tags=[tag]),
            FirewallInboundRule(protocol="icmp", source_tags=[tag]),
        ]

        def out(protocol, ports=None, **where):
            return FirewallOutboundRule(protocol=protocol, port_range=ports, **where)

        outbound = [
            out("tcp", "1-65535", destination_tags=[tag]),
            out("udp", "1-65535", destination_tags=[tag]),
            out("icmp", destination_tags=[tag]),
            out("tcp", "443", destination_addresses=ANYWHERE),  # pip, apt
            out("tcp", "80", destination_addresses=ANYWHERE),  # apt mirrors
            out("udp", "53", destination_addresses=ANYWHERE),  # DNS
            out("tcp", "53", destination_addresses=ANYWHERE),
            out("udp", "123", destination_addresses=ANYWHERE),  # NTP
            out("icmp", destination_addresses=ANYWHERE),  # mtr/ping, path-MTU replies
        ]
        return Firewall(self, "firewall", name=self.unique_name, tags=[tag],
                        inbound_rule=inbound, outbound_rule=outbound)
