"""AWS: EC2 nodes in one VPC subnet and cluster placement group per region (regions peered), jumbo
frames, an EC2 API preflight."""

from __future__ import annotations

from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from .base import Provider

SINGLE_FLOW_GBPS = 10  # EC2's limit for one flow, even inside a cluster placement group


class Aws(Provider):
    name = "aws"
    mtu = 9001  # jumbo frames inside a VPC; the internet gateway path falls back by path-MTU discovery
    user_data_limit = 16 * 1024  # EC2 refuses more

    def construct(self, scope, cluster, project):
        from .aws_stack import AwsClusterConstruct

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
        from fatpipe.infra.jobmodel import AWS_EGRESS_GBPS, AWS_EGRESS_MIN_VCPUS
        from fatpipe.infra.spec import DEFAULT_MAX_RTT_MS

        found = []
        if cluster.max_rtt_ms is None:
            found.append(f"{cluster.name}: the nodes span {len(cluster.node_regions)} regions but max_rtt_ms is not "
                         f"set: the TCP buffers are sized for {DEFAULT_MAX_RTT_MS:g} ms, far below a round trip "
                         "between regions (60-250 ms); set max_rtt_ms to the farthest one")
        if cluster.tier_gbps > AWS_EGRESS_GBPS:
            found.append(f"{cluster.name}: between regions AWS carries a node's traffic at {AWS_EGRESS_GBPS:g} "
                         f"Gbit/s (half its bandwidth from {AWS_EGRESS_MIN_VCPUS} vCPUs) and one flow at "
                         f"{AWS_EGRESS_GBPS:g}: the links between regions stay below tier {cluster.tier}; "
                         "netcheck measures them")
        return found

    def preflight(self, cluster, project, log=None):
        from .aws_api import preflight  # boto3: only for AWS clusters

        preflight(cluster, root=project.root)
        return cluster

    def console_output(self, outputs, node) -> str | None:
        from .aws_api import console_output

        if not node.instance_id:
            raise FatpipeError(f"{node.name}: the outputs name no instance id to read its host keys by; "
                               f"`fatpipe deploy {outputs.name}` writes them")
        # A node of a cluster across regions names its own region; else the cluster's.
        return console_output(node.region or outputs.region, node.instance_id)

    def refresh_catalog(self, region: str | None, root: Path, types: tuple[str, ...] = (),
                        families: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
        if not region:
            raise FatpipeError("AWS: name the region to refresh (`fatpipe catalog aws --region R`)")
        from .aws_api import api_errors, refresh_aws_catalog

        with api_errors(f"EC2 refused DescribeInstanceTypes in {region}", f"cannot reach EC2 in {region}"):
            return refresh_aws_catalog(region, root, types=types, families=families)


AWS = Aws()
