"""The AWS cluster construct: a VPC and subnet, a members-only security group, a placement group,
the nodes; in every region of a cluster across regions, with each pair of regions' VPCs peered.
Importing this module loads the chosen toolkit's AWS provider bindings (large): only
`AwsProvider.construct` does, and only when an AWS stack is synthesized.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from itertools import combinations

from fatpipe.infra.catalog import MachineType

from ..literals import literal, literal_map
from ..toolkit import (
    Fn,
    TerraformIterator,
    TerraformLocal,
    TerraformResourceLifecycle,
    Token,
    aws_bindings,
)
from .construct import ClusterConstruct

# cdktf's or cdktn's prebuilt bindings (`stacks.toolkit`): the same classes, one submodule per type.
aws = aws_bindings()
PROVIDER_SOURCE = "registry.terraform.io/hashicorp/aws"

# Canonical's and AWS's public SSM parameters always name the current AMI of the region.
UBUNTU_AMI = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{arch}/hvm/ebs-gp3/ami-id"
GPU_AMI = "/aws/service/deeplearning/ami/{arch}/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
ROOT_GIB = {"cpu": 30, "gpu": 100}  # the GPU AMI's own snapshot is ~75 GB


@dataclass
class AwsRegion:
    """One region's share of the cluster: its provider, its VPC range and nodes, and what the
    construct builds there. In a cluster of one region `prefix` is empty and `provider` None: the
    stack's only provider, and today's resource names, so an existing cluster's JSON never changes."""

    name: str  # the AWS region
    cidr: str  # its VPC and subnet
    nodes: range  # the cluster's node indexes in it
    prefix: str = ""  # before every resource id of the region ("us_west_2_"; "" in one region)
    provider: object = None  # its aliased AwsProvider; None: the stack's default provider
    egress_ready: list = field(default_factory=list)  # what a node needs before it boots
    # Built by AwsClusterConstruct, in this order:
    vpc: object = None
    subnet: object = None
    table: object = None  # the route table
    security_group: object = None
    key: object = None
    instances: object = None  # the region's `aws_instance`, for_each over its nodes

    @property
    def slug(self) -> str:
        return self.name.replace("-", "_")


class AwsClusterConstruct(ClusterConstruct):
    """The cluster's AWS resources; `regions` (an `AwsRegion` each, with what was built there) and
    `output` are what it built."""

    def __init__(self, scope, id: str, *, cluster, machine: MachineType, user_data: str, project_id: str):
        super().__init__(scope, id)
        self.cluster, self.machine = cluster, machine
        # Account-wide names carry the project id: two projects' `demo` clusters never collide.
        self.unique_name = f"fatpipe-{cluster.name}-{project_id}"
        self.regions = self._providers(scope, project_id)
        # A fully qualified source lets both terraform and tofu apply the JSON (opentofu#2402).
        scope.add_override("terraform.required_providers.aws.source", PROVIDER_SOURCE)
        for region in self.regions:
            self._network(region)
        for a, b in combinations(self.regions, 2):
            self._peering(a, b)
        for region in self.regions:
            region.key = aws.key_pair.KeyPair(self, f"{region.prefix}key", provider=region.provider,
                                              key_name_prefix=literal(f"{self.unique_name}-"),
                                              public_key=literal(cluster.public_key))
        # One copy of the user data in the JSON, however many nodes (and regions) share it.
        self.user_data = TerraformLocal(self, "user_data", literal(user_data))
        for region in self.regions:
            region.instances = self._nodes(region)
        spans = cluster.spans_regions
        self.output = cluster.output([
            {"name": name, "public_ip": f'${{aws_instance.{self._prefix(i)}nodes["{name}"].public_ip}}',
             "instance_id": f'${{aws_instance.{self._prefix(i)}nodes["{name}"].id}}',
             "private_ip": cluster.private_ip(i), "transport": "ssh",
             **({"region": cluster.node_region(i)} if spans else {})}
            for i, name in enumerate(map(cluster.node_name, range(cluster.nodes)))
        ])

    def _providers(self, scope, project_id: str) -> list[AwsRegion]:
        """The regions, each with its provider: the stack's one provider for one region, else an
        alias per region (named like the region, `us_west_2`). The providers belong to the stack."""
        cluster = self.cluster
        tags = [aws.provider.AwsProviderDefaultTags(tags=literal_map({
            "fatpipe:cluster": cluster.name, "fatpipe:project": project_id, "managed-by": "fatpipe"}))]
        regions = [AwsRegion(name, cidr, cluster.region_nodes(i))
                   for i, (name, cidr) in enumerate(zip(cluster.node_regions, cluster.region_cidrs, strict=True))]
        if len(regions) == 1:
            aws.provider.AwsProvider(scope, "aws", region=cluster.region, default_tags=tags)
            return regions
        for region in regions:
            region.prefix = f"{region.slug}_"
            region.provider = aws.provider.AwsProvider(scope, f"aws_{region.slug}", alias=region.slug,
                                                       region=region.name, default_tags=tags)
        return regions

    def _prefix(self, index: int) -> str:
        return self.regions[self.cluster.region_index(index)].prefix

    def _name_tag(self, region: AwsRegion) -> dict:
        where = f"-{region.name}" if region.prefix else ""
        return literal_map({"Name": f"fatpipe-{self.cluster.name}{where}"})

    def _network(self, region: AwsRegion) -> None:
        """VPC, one subnet in a zone that offers the type, an internet route, the security group."""
        cluster, p, provider = self.cluster, region.prefix, region.provider
        region.vpc = aws.vpc.Vpc(self, f"{p}vpc", provider=provider, cidr_block=region.cidr, enable_dns_support=True,
                                 enable_dns_hostnames=True, tags=self._name_tag(region))
        # The VPC's default group would let any member of it talk to any other: empty it.
        aws.default_security_group.DefaultSecurityGroup(self, f"{p}default_sg", provider=provider,
                                                        vpc_id=region.vpc.id)
        zone = cluster.availability_zone  # one region only (the cluster file refuses it with several)
        if zone is None:
            # Not every zone offers every type: take the first that offers this one.
            offerings = aws.data_aws_ec2_instance_type_offerings
            offers = offerings.DataAwsEc2InstanceTypeOfferings(
                self, f"{p}zones", provider=provider, location_type="availability-zone",
                filter=[offerings.DataAwsEc2InstanceTypeOfferingsFilter(name="instance-type",
                                                                         values=[self.machine.name])],
            )
            zone = Fn.element(Fn.sort(offers.locations), 0)
        region.subnet = aws.subnet.Subnet(self, f"{p}subnet", provider=provider, vpc_id=region.vpc.id,
                                          cidr_block=region.cidr, availability_zone=zone,
                                          map_public_ip_on_launch=False, tags=self._name_tag(region))
        igw = aws.internet_gateway.InternetGateway(self, f"{p}igw", provider=provider, vpc_id=region.vpc.id)
        region.table = aws.route_table.RouteTable(self, f"{p}routes", provider=provider, vpc_id=region.vpc.id)
        internet_route = aws.route.Route(self, f"{p}internet", provider=provider, route_table_id=region.table.id,
                                         destination_cidr_block="0.0.0.0/0", gateway_id=igw.id)
        association = aws.route_table_association.RouteTableAssociation(
            self, f"{p}subnet_routes", provider=provider, subnet_id=region.subnet.id, route_table_id=region.table.id)
        # A node that boots before its route, association or rules exist has no egress: apt fails.
        region.egress_ready += [internet_route, association]
        region.security_group = self._security_group(region)

    def _security_group(self, region: AwsRegion):
        """SSH from `ssh_cidr` only, everything between members (and from and to each other
        region's VPC range, exactly), and explicit egress for apt/pip."""
        cluster, p = self.cluster, region.prefix
        group = aws.security_group.SecurityGroup(
            self, f"{p}members", provider=region.provider, name=literal(self.unique_name), vpc_id=region.vpc.id,
            description=literal(f"fatpipe cluster {cluster.name}: SSH from ssh_cidr, all traffic between members"))
        ssh_net = ipaddress.ip_network(cluster.ssh_cidr)
        source = {"cidr_ipv6" if ssh_net.version == 6 else "cidr_ipv4": str(ssh_net)}
        ingress = {
            "ssh": dict(ip_protocol="tcp", from_port=22, to_port=22, description="SSH from ssh_cidr", **source),
            # Training ports (rendezvous, NCCL/gloo) are open between members and nowhere else.
            "from_members": dict(ip_protocol="-1", referenced_security_group_id=group.id,
                                 description="all traffic between cluster members"),
            # Path-MTU discovery: nodes run 9001-byte frames, the internet gateway passes 1500.
            "pmtud": dict(ip_protocol="icmp", from_port=3, to_port=4, cidr_ipv4="0.0.0.0/0",
                          description="ICMP fragmentation-needed, for path-MTU discovery"),
        }
        egress = {
            "to_members": dict(ip_protocol="-1", referenced_security_group_id=group.id,
                               description="all traffic between cluster members"),
            "https": dict(ip_protocol="tcp", from_port=443, to_port=443, cidr_ipv4="0.0.0.0/0",
                          description="HTTPS: pip, apt, git"),
            "http": dict(ip_protocol="tcp", from_port=80, to_port=80, cidr_ipv4="0.0.0.0/0",
                         description="HTTP: Ubuntu apt mirrors"),
        }
        # A group cannot name a group of another region: the members there are their VPC's range,
        # which holds nothing but them (its subnet is the whole VPC, its default group emptied).
        for peer in self.regions:
            if peer is not region:
                ingress[f"from_{peer.slug}"] = dict(ip_protocol="-1", cidr_ipv4=peer.cidr,
                                                    description=f"all traffic from the cluster's VPC in {peer.name}")
                egress[f"to_{peer.slug}"] = dict(ip_protocol="-1", cidr_ipv4=peer.cidr,
                                                 description=f"all traffic to the cluster's VPC in {peer.name}")
        inbound = aws.vpc_security_group_ingress_rule.VpcSecurityGroupIngressRule
        outbound = aws.vpc_security_group_egress_rule.VpcSecurityGroupEgressRule
        for name, rule in ingress.items():
            region.egress_ready.append(inbound(self, f"{p}in_{name}", provider=region.provider,
                                              security_group_id=group.id, **rule))
        for name, rule in egress.items():
            region.egress_ready.append(outbound(self, f"{p}out_{name}", provider=region.provider,
                                               security_group_id=group.id, **rule))
        return group

    def _peering(self, a: AwsRegion, b: AwsRegion) -> None:
        """`a` asks to peer with `b`'s VPC, `b` accepts (one account), and each route table sends
        the other's range over it. AWS encrypts traffic between regions on a peering connection."""
        pair = f"{a.slug}_{b.slug}"
        tags = literal_map({"Name": f"fatpipe-{self.cluster.name}-{a.name}-{b.name}"})
        request = aws.vpc_peering_connection.VpcPeeringConnection(
            self, f"peering_{pair}", provider=a.provider, vpc_id=a.vpc.id, peer_vpc_id=b.vpc.id,
            peer_region=b.name, tags=tags)
        # Accepted in the peer's region (auto_accept on the request is only for one region).
        accepted = aws.vpc_peering_connection_accepter.VpcPeeringConnectionAccepterA(
            self, f"accept_{pair}", provider=b.provider, vpc_peering_connection_id=request.id,
            auto_accept=True, tags=tags)
        # Both routes name the accepter's id: neither is made before the connection is active.
        for here, there in ((a, b), (b, a)):
            aws.route.Route(self, f"{here.prefix}to_{there.slug}", provider=here.provider,
                            route_table_id=here.table.id, destination_cidr_block=there.cidr,
                            vpc_peering_connection_id=accepted.id)

    def _ami(self, region: AwsRegion) -> str:
        machine = self.machine
        if machine.gpus:
            name = GPU_AMI.format(arch="arm64" if machine.arch == "arm64" else "x86_64")
        else:
            name = UBUNTU_AMI.format(arch="arm64" if machine.arch == "arm64" else "amd64")
        # insecure_value: an AMI id is no secret, and `value` would hide it in every plan.
        return aws.data_aws_ssm_parameter.DataAwsSsmParameter(self, f"{region.prefix}ami", provider=region.provider,
                                                              name=name).insecure_value

    def _nodes(self, region: AwsRegion):
        """One `aws_instance.nodes` (per region: `<region>_nodes`) with for_each over {node name:
        private IP}.

        The map puts every node's deterministic IP literally in the JSON, and a single resource
        keeps synth time flat in the node count (each construct costs a jsii round trip).
        """
        cluster, machine, p = self.cluster, self.machine, region.prefix
        placement = None
        if machine.cluster_placement:
            # One rack-local group: the lowest latency and the full per-flow bandwidth between nodes.
            # (A group is in one zone: a region's nodes share one, no group spans regions.)
            placement = aws.placement_group.PlacementGroup(self, f"{p}placement", provider=region.provider,
                                                           name=literal(self.unique_name), strategy="cluster").name
        nodes = TerraformIterator.from_map({cluster.node_name(i): cluster.private_ip(i) for i in region.nodes})
        # IMDSv2 only. Hop limit 1: nothing in a container or behind a forwarding hop on the node
        # reaches the metadata service (the trainer runs on the host and needs no instance
        # credentials; none are attached).
        metadata = aws.instance.InstanceMetadataOptions(http_endpoint="enabled", http_tokens="required",
                                                        http_put_response_hop_limit=1)
        root = aws.instance.InstanceRootBlockDevice(volume_type="gp3", encrypted=True, delete_on_termination=True,
                                                    volume_size=ROOT_GIB["gpu" if machine.gpus else "cpu"])
        return aws.instance.Instance(
            self, f"{p}nodes",
            provider=region.provider,
            for_each=nodes,
            ami=self._ami(region),
            instance_type=machine.name,
            subnet_id=region.subnet.id,
            private_ip=Token.as_string(nodes.value),  # known before boot: node 0 is the rendezvous host
            vpc_security_group_ids=[region.security_group.id],
            associate_public_ip_address=True,  # SSH and apt/pip; the security group limits who
            key_name=region.key.key_name,
            placement_group=placement,
            ebs_optimized=True,
            monitoring=True,  # 1-minute CloudWatch NetworkIn/Out: link use without logging in
            user_data=self.user_data.as_string,
            # Changed user data must boot a fresh node: a stop/start would not rerun cloud-init,
            # the old tuning would stay, and `fatpipe wait` would never pass.
            user_data_replace_on_change=True,
            metadata_options=metadata,
            root_block_device=root,
            # A newer AMI in the SSM parameter must not replace running nodes.
            lifecycle=TerraformResourceLifecycle(ignore_changes=["ami"]),
            depends_on=region.egress_ready,
            tags={"Name": Token.as_string(nodes.key)},
        )
