"""The DigitalOcean cluster construct: a VPC, droplets tagged as members, and a firewall keyed on that tag.

The API token comes from DIGITALOCEAN_TOKEN at apply time; it never enters the JSON. The resources
are the core's generic TerraformProvider/TerraformResource holding Terraform's own attribute names,
not prebuilt bindings: CDK Terrain has none for DigitalOcean, cdktf's must not be mixed with it, and
one code path writes the same JSON with either toolkit (docs/toolkits.md).
"""

from __future__ import annotations

from fatpipe.infra.catalog import MachineType

from ..literals import literal
from ..toolkit import (
    TerraformIterator,
    TerraformLocal,
    TerraformProvider,
    TerraformProviderGeneratorMetadata,
    TerraformResource,
    Token,
)
from .construct import ClusterConstruct

# A fully qualified source lets both terraform and tofu apply the JSON (opentofu#2402).
PROVIDER_SOURCE = "registry.terraform.io/digitalocean/digitalocean"
# The exact release cdktf-cdktf-provider-digitalocean 13.14 pinned (its bindings built these stacks
# before); now fatpipe's own pin, and the attribute names below are checked against those bindings
# (tests/system/test_toolkits.py).
PROVIDER_VERSION = "2.71.0"
ANYWHERE = ["0.0.0.0/0", "::/0"]


def resource(scope, id: str, kind: str, attributes: dict, **meta) -> TerraformResource:
    """A `kind` resource with `attributes` named as Terraform names them; a None value is left out,
    as prebuilt bindings leave out an argument not given. `meta`: for_each, depends_on, ..."""
    made = TerraformResource(scope, id, terraform_resource_type=kind, **meta)
    for key, value in attributes.items():
        if value is not None:
            made.add_override(key, value)
    return made


def rule(protocol: str, ports: str | None = None, **where) -> dict:
    """One firewall rule block; no port range for ICMP."""
    return {"protocol": protocol, **({"port_range": ports} if ports else {}), **where}


class DigitalOceanClusterConstruct(ClusterConstruct):
    """The cluster's DigitalOcean resources; `vpc`, `tag`, `firewall`, `nodes` are what it built."""

    def __init__(self, scope, id: str, *, cluster, size: MachineType, user_data: str, project_id: str):
        super().__init__(scope, id)
        self.cluster = cluster
        # Account-wide names carry the project id: two projects' `demo` clusters never collide.
        self.unique_name = unique = literal(f"fatpipe-{cluster.name}-{project_id}")
        # The provider belongs to the stack (one per stack), not to the cluster construct.
        TerraformProvider(scope, "digitalocean", terraform_resource_type="digitalocean",
                          terraform_provider_source=PROVIDER_SOURCE,
                          terraform_generator_metadata=TerraformProviderGeneratorMetadata(
                              provider_name="digitalocean", provider_version=PROVIDER_VERSION))
        self.vpc = resource(self, "vpc", "digitalocean_vpc", {
            "name": unique, "region": cluster.region, "ip_range": cluster.private_cidr,
            "description": literal(f"fatpipe cluster {cluster.name}")})
        fingerprint = cluster.ssh_key_fingerprint or resource(self, "key", "digitalocean_ssh_key", {
            "name": unique, "public_key": literal(cluster.public_key)}).get_string_attribute("fingerprint")
        self.tag = resource(self, "members", "digitalocean_tag", {"name": unique})
        self.firewall = self._firewall()
        self.user_data = TerraformLocal(self, "user_data", literal(user_data))
        names = [cluster.node_name(i) for i in range(cluster.nodes)]
        # One resource with for_each over the node names: synth time stays flat in the node count.
        nodes = TerraformIterator.from_list(names)
        self.nodes = resource(self, "nodes", "digitalocean_droplet", {
            "name": Token.as_string(nodes.key),
            "image": cluster.image,
            "size": size.name,
            "region": cluster.region,
            "vpc_uuid": self.vpc.get_string_attribute("id"),
            "ssh_keys": [fingerprint],
            "tags": [self.tag.get_string_attribute("id")],
            "user_data": self.user_data.as_string,
            "ipv6": False,
            "monitoring": True,  # the metrics agent: bandwidth graphs per droplet
        }, for_each=nodes)
        # DigitalOcean assigns VPC addresses itself: the private IPs are known after apply.
        self.output = cluster.output([
            {"name": name, "public_ip": f'${{digitalocean_droplet.nodes["{name}"].ipv4_address}}',
             "instance_id": f'${{digitalocean_droplet.nodes["{name}"].id}}',
             "private_ip": f'${{digitalocean_droplet.nodes["{name}"].ipv4_address_private}}',
             "transport": "ssh"}
            for name in names
        ])

    def _firewall(self) -> TerraformResource:
        """SSH from `ssh_cidr`; all TCP/UDP/ICMP between members; out only what nodes need."""
        # A reference to the tag's name, so the firewall waits for the tag.
        tag = self.tag.get_string_attribute("name")
        inbound = [
            rule("tcp", "22", source_addresses=[self.cluster.ssh_cidr]),
            rule("tcp", "1-65535", source_tags=[tag]),
            rule("udp", "1-65535", source_tags=[tag]),
            rule("icmp", source_tags=[tag]),
        ]
        outbound = [
            rule("tcp", "1-65535", destination_tags=[tag]),
            rule("udp", "1-65535", destination_tags=[tag]),
            rule("icmp", destination_tags=[tag]),
            rule("tcp", "443", destination_addresses=ANYWHERE),  # pip, apt
            rule("tcp", "80", destination_addresses=ANYWHERE),  # apt mirrors
            rule("udp", "53", destination_addresses=ANYWHERE),  # DNS
            rule("tcp", "53", destination_addresses=ANYWHERE),
            rule("udp", "123", destination_addresses=ANYWHERE),  # NTP
            rule("icmp", destination_addresses=ANYWHERE),  # mtr/ping, path-MTU replies
        ]
        return resource(self, "firewall", "digitalocean_firewall", {
            "name": self.unique_name, "tags": [tag], "inbound_rule": inbound, "outbound_rule": outbound})
