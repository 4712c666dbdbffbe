"""A provider's published network limits, which `fatpipe plan` caps a link with (infra/jobmodel.py).

Each cluster model names its provider's limits (`ClusterBase.network`); a provider that
publishes none has `NO_PUBLISHED_CAPS`. Pure arithmetic on documented figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import MachineType
from .errors import ConfigError

# Where the ring's traffic goes: inside one region (the private network), between regions, or
# over the internet (public addresses).
SPANS = ("region", "regions", "internet")


@dataclass(frozen=True)
class NetworkLimits:
    """One TCP flow's cap (inside a placement group and outside one), the cap on a node's traffic
    leaving its region, and the flows NCCL opens per peer by itself; None: none published."""

    flow_gbps_placed: float | None = None  # one flow between nodes of one placement group
    flow_gbps: float | None = None  # one flow anywhere else
    egress_gbps: float | None = None  # all of a node's flows out of its region, below...
    egress_min_vcpus: int = 0  # ...this many vCPUs; from it, `egress_share` of its bandwidth
    egress_share: float = 0.0
    nccl_flows: int | None = None  # NCCL's own sockets per peer; None: the tier's profile sets them

    def flow_cap(self, machine: MachineType, span: str = "region") -> float | None:
        """The most one TCP flow carries between two nodes of this type. No placement group spans
        regions or the internet."""
        placed = machine.cluster_placement and span == "region"
        return self.flow_gbps_placed if placed else self.flow_gbps

    def egress_cap(self, machine: MachineType, span: str = "region") -> float | None:
        """What all of a node's flows together carry out of its region."""
        if span not in SPANS:
            raise ConfigError(f"span must be one of {', '.join(SPANS)}, not {span!r}")
        if span == "region" or self.egress_gbps is None:
            return None
        if machine.vcpus >= self.egress_min_vcpus and machine.baseline_gbps is not None:
            return max(self.egress_share * machine.baseline_gbps, self.egress_gbps)
        return self.egress_gbps


NO_PUBLISHED_CAPS = NetworkLimits()  # DigitalOcean publishes no per-flow limit, nor an egress cap
# beyond the per-Droplet limit its catalog already holds; the local providers and `ssh` none.

# AWS caps one TCP flow at 5 Gbit/s between instances outside a cluster placement group and
# 10 Gbit/s inside one ("Amazon EC2 instance network bandwidth", EC2 User Guide). fatpipe puts
# AWS nodes in a cluster placement group when the type may join one (`cluster_placement`).
# Outside its region AWS caps an instance's multi-flow traffic at 5 Gbit/s below 32 vCPUs, else
# at half its bandwidth or 5, whichever is larger (the same guide: traffic to other Regions, an
# internet gateway, Direct Connect or local gateways). NCCL recognises AWS's ENA and opens
# 2 threads x 8 sockets per peer by itself; fatpipe leaves NCCL's socket settings alone there
# (stacks/providers/aws.py).
AWS_NETWORK = NetworkLimits(flow_gbps_placed=10.0, flow_gbps=5.0, egress_gbps=5.0, egress_min_vcpus=32,
                            egress_share=0.5, nccl_flows=2 * 8)
