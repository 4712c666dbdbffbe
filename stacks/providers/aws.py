"""AWS: EC2 nodes in one VPC subnet and cluster placement group per region (regions peered), jumbo
frames, an EC2 API preflight."""

from __future__ import annotations

from pathlib import Path

import fatpipe.stacks.providers.aws_api as aws_api  # boto3 loads in its calls alone; a test may stand in for one
from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.lazy import load
from fatpipe.infra.netlimits import AWS_NETWORK
from fatpipe.infra.spec import DEFAULT_MAX_RTT_MS

from .base import Provider

SINGLE_FLOW_GBPS = 10  # EC2's limit for one flow, even inside a cluster placement group
IMAGE_PYTHON = "3.12"  # the stack's AMIs (aws_stack.py): Ubuntu 24.04, plain or the Deep Learning Base AMI


class Aws(Provider):
    name = "aws"
    mtu = 9001  # jumbo frames inside a VPC; the internet gateway path falls back by path-MTU discovery
    user_data_limit = 16 * 1024  # EC2 refuses more

    def construct(self, scope, cluster, project):
        AwsClusterConstruct = load("fatpipe.stacks.providers.aws_stack").AwsClusterConstruct  # the CDK: a synth's alone
        return AwsClusterConstruct(scope, "cluster_resources", cluster=cluster,
                                   machine=self.machine(cluster, project.root),
                                   user_data=self.user_data(cluster), project_id=project.project_id)

    def nccl_env(self, cluster) -> dict[str, str]:
        # NCCL recognises AWS's ENA and opens 2 threads x 8 sockets per peer by itself: the
        # tier's counts would only lower that.
        return {"NCCL_IB_DISABLE": "1"}

    def warnings(self, cluster) -> list[str]:
        found = []
        if cluster.tier_gbps > SINGLE_FLOW_GBPS and not cluster.gpus_per_node:
            found.append(f"{cluster.name}: AWS caps one TCP flow at {SINGLE_FLOW_GBPS} Gbit/s (5 outside a "
                         "placement group) and gloo, the CPU backend, opens one flow per peer: a CPU cluster "
                         f"cannot reach tier {cluster.tier}; NCCL on GPU nodes spreads over many flows. "
                         "netcheck shows single- against multi-flow throughput.")
        if cluster.spans_regions:
            found += self._region_warnings(cluster)
        return found

    def _region_warnings(self, cluster) -> list[str]:
        found = []
        if cluster.max_rtt_ms is None:
            found.append(f"{cluster.name}: the nodes span {len(cluster.node_regions)} regions but max_rtt_ms is not "
                         f"set: the TCP buffers are sized for {DEFAULT_MAX_RTT_MS:g} ms, far below a round trip "
                         "between regions (60-250 ms); set max_rtt_ms to the farthest one")
        if cluster.tier_gbps > AWS_NETWORK.egress_gbps:
            found.append(f"{cluster.name}: between regions AWS carries a node's traffic at {AWS_NETWORK.egress_gbps:g} "
                         f"Gbit/s (half its bandwidth from {AWS_NETWORK.egress_min_vcpus} vCPUs) and one flow at "
                         f"{AWS_NETWORK.egress_gbps:g}: the links between regions stay below tier {cluster.tier}; "
                         "netcheck measures them")
        return found

    def image_python(self, cluster) -> str | None:
        return IMAGE_PYTHON

    def preflight(self, cluster, project, log=None):
        aws_api.preflight(cluster, root=project.root)
        return cluster

    def console_output(self, outputs, node) -> str | None:
        if not node.instance_id:
            raise FatpipeError(f"{node.name}: the outputs name no instance id to read its host keys by; "
                               f"`fatpipe deploy {outputs.name}` writes them")
        # A node of a cluster across regions names its own region; else the cluster's.
        return aws_api.console_output(node.region or outputs.region, node.instance_id)

    def refresh_wanted(self, region: str | None, filtered: bool) -> bool:
        """For a named region."""
        if filtered and not region:
            raise ConfigError("--types/--families refresh a region's catalog: add --region")
        return bool(region)

    def refresh_catalog(self, region: str | None, root: Path, types: tuple[str, ...] = (),
                        families: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
        if not region:
            raise FatpipeError("AWS: name the region to refresh (`fatpipe catalog aws --region R`)")
        with aws_api.api_errors(f"EC2 refused DescribeInstanceTypes in {region}", f"cannot reach EC2 in {region}"):
            return aws_api.refresh_aws_catalog(region, root, types=types, families=families)


AWS = Aws()
