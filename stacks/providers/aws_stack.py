"""The AWS cluster construct: a VPC and subnet, a members-only security group, a placement group,
the nodes. Importing this module loads the chosen toolkit's AWS provider bindings (large): only
`AwsProvider.construct` does, and only when an AWS stack is synthesized.
"""

from __future__ import annotations

import ipaddress

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


class AwsClusterConstruct(ClusterConstruct):
    """The cluster's AWS resources; `vpc`, `subnet`, `security_group`, `key`, `nodes` are what it built."""

    def __init__(self, scope, id: str, *, cluster, machine: MachineType, user_data: str, project_id: str):
        super().__init__(scope, id)
        self.cluster, self.machine = cluster, machine
        # Account-wide names carry the project id: two projects' `demo` clusters never collide.
        self.unique_name = f"fatpipe-{cluster.name}-{project_id}"
        # The provider belongs to the stack (one per stack), not to the cluster construct.
        aws.provider.AwsProvider(
            scope, "aws", region=cluster.region,
            default_tags=[aws.provider.AwsProviderDefaultTags(tags=literal_map({
                "fatpipe:cluster": cluster.name, "fatpipe:project": project_id, "managed-by": "fatpipe"}))],
        )
        # A fully qualified source lets both terraform and tofu apply the JSON (opentofu#2402).
        scope.add_override("terraform.required_providers.aws.source", PROVIDER_SOURCE)
        self._network()
        self.key = aws.key_pair.KeyPair(self, "key", key_name_prefix=literal(f"{self.unique_name}-"),
                                        public_key=literal(cluster.public_key))
        # One copy of the user data in the JSON, however many nodes share it.
        self.user_data = TerraformLocal(self, "user_data", literal(user_data))
        self.nodes = self._nodes()
        self.output = cluster.output([
            {"name": name, "public_ip": f'${{aws_instance.nodes["{name}"].public_ip}}',
             "instance_id": f'${{aws_instance.nodes["{name}"].id}}',
             "private_ip": cluster.private_ip(i), "transport": "ssh"}
            for i, name in enumerate(map(cluster.node_name, range(cluster.nodes)))
        ])

    def _network(self) -> None:
        """VPC, one subnet in a zone that offers the type, an internet route, the security group."""
        cluster = self.cluster
        self.vpc = aws.vpc.Vpc(self, "vpc", cidr_block=cluster.private_cidr, enable_dns_support=True,
                               enable_dns_hostnames=True, tags=literal_map({"Name": f"fatpipe-{cluster.name}"}))
        # The VPC's default group would let any member of it talk to any other: empty it.
        aws.default_security_group.DefaultSecurityGroup(self, "default_sg", vpc_id=self.vpc.id)
        zone = cluster.availability_zone
        if zone is None:
            # Not every zone offers every type: take the first that offers this one.
            offerings = aws.data_aws_ec2_instance_type_offerings
            offers = offerings.DataAwsEc2InstanceTypeOfferings(
                self, "zones", location_type="availability-zone",
                filter=[offerings.DataAwsEc2InstanceTypeOfferingsFilter(name="instance-type", values=[self.machine.name])],
            )
            zone = Fn.element(Fn.sort(offers.locations), 0)
        self.subnet = aws.subnet.Subnet(self, "subnet", vpc_id=self.vpc.id, cidr_block=cluster.private_cidr,
                                        availability_zone=zone, map_public_ip_on_launch=False,
                                        tags=literal_map({"Name": f"fatpipe-{cluster.name}"}))
        igw = aws.internet_gateway.InternetGateway(self, "igw", vpc_id=self.vpc.id)
        table = aws.route_table.RouteTable(self, "routes", vpc_id=self.vpc.id)
        self.internet_route = aws.route.Route(self, "internet", route_table_id=table.id,
                                              destination_cidr_block="0.0.0.0/0", gateway_id=igw.id)
        association = aws.route_table_association.RouteTableAssociation(
            self, "subnet_routes", subnet_id=self.subnet.id, route_table_id=table.id)
        # A node that boots before its route, association or rules exist has no egress: apt fails.
        self.egress_ready = [self.internet_route, association]
        self.security_group = self._security_group()

    def _security_group(self):
        """SSH from `ssh_cidr` only, everything between members, and explicit egress for apt/pip."""
        cluster = self.cluster
        group = aws.security_group.SecurityGroup(
            self, "members", name=literal(self.unique_name), vpc_id=self.vpc.id,
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
        inbound = aws.vpc_security_group_ingress_rule.VpcSecurityGroupIngressRule
        outbound = aws.vpc_security_group_egress_rule.VpcSecurityGroupEgressRule
        for name, rule in ingress.items():
            self.egress_ready.append(inbound(self, f"in_{name}", security_group_id=group.id, **rule))
        for name, rule in egress.items():
            self.egress_ready.append(outbound(self, f"out_{name}", security_group_id=group.id, **rule))
        return group

    def _ami(self) -> str:
        machine = self.machine
        if machine.gpus:
            name = GPU_AMI.format(arch="arm64" if machine.arch == "arm64" else "x86_64")
        else:
            name = UBUNTU_AMI.format(arch="arm64" if machine.arch == "arm64" else "amd64")
        # insecure_value: an AMI id is no secret, and `value` would hide it in every plan.
        return aws.data_aws_ssm_parameter.DataAwsSsmParameter(self, "ami", name=name).insecure_value

    def _nodes(self):
        """One `aws_instance.nodes` with for_each over {node name: private IP}.

        The map puts every node's deterministic IP literally in the JSON, and a single resource
        keeps synth time flat in the node count (each construct costs a jsii round trip).
        """
        cluster, machine = self.cluster, self.machine
        placement = None
        if machine.cluster_placement:
            # One rack-local group: the lowest latency and the full per-flow bandwidth between nodes.
            placement = aws.placement_group.PlacementGroup(self, "placement", name=literal(self.unique_name),
                                                           strategy="cluster").name
        nodes = TerraformIterator.from_map({cluster.node_name(i): cluster.private_ip(i) for i in range(cluster.nodes)})
        # IMDSv2 only. Hop limit 1: nothing in a container or behind a forwarding hop on the node
        # reaches the metadata service (the trainer runs on the host and needs no instance
        # credentials; none are attached).
        metadata = aws.instance.InstanceMetadataOptions(http_endpoint="enabled", http_tokens="required",
                                                        http_put_response_hop_limit=1)
        root = aws.instance.InstanceRootBlockDevice(volume_type="gp3", encrypted=True, delete_on_termination=True,
                                                    volume_size=ROOT_GIB["gpu" if machine.gpus else "cpu"])
        return aws.instance.Instance(
            self, "nodes",
            for_each=nodes,
            ami=self._ami(),
            instance_type=machine.name,
            subnet_id=self.subnet.id,
            private_ip=Token.as_string(nodes.value),  # known before boot: node 0 is the rendezvous host
            vpc_security_group_ids=[self.security_group.id],
            associate_public_ip_address=True,  # SSH and apt/pip; the security group limits who
            key_name=self.key.key_name,
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
            depends_on=self.egress_ready,
            tags={"Name": Token.as_string(nodes.key)},
        )
