"""The `aws` provider's cluster: EC2 nodes in one region, or spread over several, each region a VPC
of its own peered with every other (docs/clouds-and-plan.md, "AWS: nodes in several regions")."""

from __future__ import annotations

import ipaddress
from itertools import islice
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .netlimits import AWS_NETWORK, NetworkLimits
from .spec import FIRST_HOST_OFFSET, CloudCluster, aws_regions, group_of


def _aws_region(value: str) -> str:
    if value not in aws_regions():
        raise ValueError(f"{value!r} is not an AWS region (for example us-east-1, eu-west-1)")
    return value


class AwsCluster(CloudCluster):
    provider: Literal["aws"]
    machine_field: ClassVar[str] = "instance_type"  # the key that names a machine type
    prefix_range: ClassVar[tuple[int, int]] = (16, 28)  # what EC2 accepts for a VPC and subnet
    network: ClassVar[NetworkLimits] = AWS_NETWORK
    state_bucket_in_region: ClassVar[bool] = True
    host_keys: ClassVar[str] = "pinned"  # from the console output cloud-init prints them to
    instance_type: str | None = None
    availability_zone: str | None = None
    # Nodes in several regions (docs/clouds-and-plan.md, "AWS: nodes in several regions"): consecutive
    # groups as even as can be, node i in regions[i * len(regions) // nodes] (a vm cluster's rule),
    # each region a VPC of its own, `region_cidrs`, peered with every other. `region` is the first,
    # the home region (the catalog's, the S3 state bucket's default), and may be left out.
    regions: list[str] | None = Field(None, min_length=1)

    _region = field_validator("region")(_aws_region)

    @model_validator(mode="before")
    @classmethod
    def _home_region_first(cls, data):
        if isinstance(data, dict) and "region" not in data and "regions" in data:
            regions = data["regions"]
            if not (isinstance(regions, list) and regions and isinstance(regions[0], str)):
                raise ValueError('regions: a list of AWS regions, the home region first, such as '
                                 '["us-east-1", "us-west-2"]')
            data = {**data, "region": regions[0]}
        return data

    @field_validator("regions")
    @classmethod
    def _known_and_distinct(cls, value: list[str] | None) -> list[str] | None:
        for i, region in enumerate(value or []):
            _aws_region(region)
            if region in value[:i]:
                raise ValueError(f"{region} is named twice; name each region once")
        return value

    @model_validator(mode="after")
    def _regions_fit(self):
        regions = self.node_regions
        if regions[0] != self.region:
            raise ValueError(f"region {self.region} is not the first of regions ({regions[0]}): the first is "
                             "the home region; leave region out or name it first")
        if len(regions) == 1:
            return self
        if len(regions) > self.nodes:
            raise ValueError(f"regions: {len(regions)} regions but {self.nodes} nodes; every region needs a node")
        if self.availability_zone is not None:
            raise ValueError("availability_zone: a zone is in one region; leave it out when the nodes span regions")
        part = ipaddress.IPv4Network(self.region_cidrs[0])
        smallest = self.prefix_range[1]
        if part.prefixlen > smallest:
            raise ValueError(f"private_cidr {self.private_cidr} split over {len(regions)} regions gives each a "
                             f"/{part.prefixlen}, and an AWS VPC is /{smallest} at least; use a larger network "
                             "such as /22")
        usable = part.num_addresses - FIRST_HOST_OFFSET - 1
        most = max(len(self.region_nodes(r)) for r in range(len(regions)))
        if most > usable:
            raise ValueError(f"private_cidr {self.private_cidr} split over {len(regions)} regions holds at most "
                             f"{usable} nodes a region (a /{part.prefixlen} each, addresses from "
                             f".{FIRST_HOST_OFFSET}), "
                             f"and a region gets {most}; use a larger network such as /22")
        return self

    @property
    def node_regions(self) -> list[str]:
        """The regions the nodes are in, the home region first (`region` alone for one region)."""
        return self.regions or [self.region]

    @property
    def spans_regions(self) -> bool:
        return len(self.node_regions) > 1

    @property
    def region_cidrs(self) -> list[str]:
        """Each region's VPC, in the order of `node_regions`: private_cidr cut into the fewest equal
        parts that give every region one (two regions of a /24: two /25s; three: the first three
        /26s); in one region, private_cidr itself. Fixed by the cluster file, never overlapping, so
        every pair of regions can peer."""
        regions = self.node_regions
        parts = ipaddress.IPv4Network(self.private_cidr).subnets(prefixlen_diff=(len(regions) - 1).bit_length())
        return [str(part) for part in islice(parts, len(regions))]

    def region_index(self, index: int) -> int:
        """The position in `node_regions` of node `index`'s region."""
        return group_of(index, len(self.node_regions), self.nodes)

    def node_region(self, index: int) -> str:
        return self.node_regions[self.region_index(index)]

    def output_region(self, index: int) -> str | None:
        """The `region` node `index`'s output carries: None in one region (the outputs contract)."""
        return self.node_region(index) if self.spans_regions else None

    def deployment_keys(self, outputs) -> list[tuple[str, object, object]]:
        # Nodes in other regions are other nodes.
        return [("regions", [node.region for node in outputs.nodes],
                 [self.output_region(i) for i in range(self.nodes)])]

    def region_nodes(self, position: int) -> range:
        """The nodes of the region at `position` in `node_regions`: consecutive, as region_index puts them."""
        count, nodes = len(self.node_regions), self.nodes
        return range(-(-position * nodes // count), -(-(position + 1) * nodes // count))

    def private_ip(self, index: int) -> str:
        """From .10 up in the node's region's VPC, counted from that region's first node; in one
        region exactly ClusterBase's (private_cidr's .10 + index). Node 0 is always the first
        region's .10: the rendezvous host."""
        position = self.region_index(index)
        net = ipaddress.IPv4Network(self.region_cidrs[position])
        return str(net.network_address + FIRST_HOST_OFFSET + index - self.region_nodes(position).start)
