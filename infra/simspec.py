"""The sim's cluster model: nodes on this machine's kernel (network namespaces or loopback)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .spec import LocalCluster, group_of


class SimCluster(LocalCluster):
    """Nodes on this machine: network namespaces shaped with tc, or loopback addresses."""

    provider: Literal["sim"]
    shares_kernel: ClassVar[bool] = True
    isolation: Literal["auto", "netns", "loopback"] = "auto"
    # ssh: every namespace runs sshd on its private IP, and fatpipe reaches and tunes the node
    # over SSH exactly as it does a rented machine (netns isolation only).
    transport: Literal["netns", "ssh"] = "netns"
    ssh_user: str = ""
    firewall: bool = True  # transport ssh: the host firewall rented machines get (infra/firewall.py)
    # Regions rehearsed: the nodes split into `regions` consecutive groups (node i is in region
    # i * regions // nodes), each on its own bridge at the tier's rate, joined by one link of
    # `cross_region_gbps` that every cross-region flow shares; `cross_region_flow_gbps` caps each
    # flow on it (stacks/sim/regions.py).
    regions: int = Field(1, ge=1, le=16)
    cross_region_gbps: float | None = Field(None, ge=0.001, le=100)
    cross_region_flow_gbps: float | None = Field(None, ge=0.001, le=100)

    @field_validator("max_rtt_ms")
    @classmethod
    def _no_round_trip(cls, value: float | None) -> float | None:
        # Namespaces of one kernel: no link has a round trip, and rmem_max/wmem_max are the host's.
        if value is not None:
            raise ValueError("sim nodes have no round trip to size buffers for (max_rtt_ms is for aws, "
                             "digitalocean, ssh and vm clusters)")
        return value

    @model_validator(mode="after")
    def _ssh_needs_namespaces(self):
        if self.transport == "ssh" and self.isolation == "loopback":
            raise ValueError("transport = \"ssh\" needs isolation = \"netns\" (or \"auto\" as root)")
        return self

    @model_validator(mode="after")
    def _regions_fit(self):
        if self.regions > self.nodes:
            raise ValueError(f"regions = {self.regions}: more regions than nodes ({self.nodes})")
        if self.regions == 1 and (self.cross_region_gbps or self.cross_region_flow_gbps):
            raise ValueError("cross_region_gbps: needs regions >= 2 (one region has no cross-region link)")
        if self.regions > 1 and self.cross_region_gbps is None:
            raise ValueError(f"regions = {self.regions}: give cross_region_gbps, the rate between regions")
        if self.regions > 1 and self.isolation == "loopback":
            raise ValueError(f"regions = {self.regions}: regions are shaped netns links; loopback nodes are not shaped")
        flow = self.cross_region_flow_gbps
        if flow and flow > self.cross_region_gbps:
            raise ValueError(f"cross_region_flow_gbps {flow:g} is above cross_region_gbps {self.cross_region_gbps:g}")
        return self

    def deployment_keys(self, outputs) -> list[tuple[str, object, object]]:
        # "auto" settles on this machine (netns as root, else loopback): either is this cluster.
        return [] if self.isolation == "auto" else [("isolation", outputs.isolation, self.isolation)]

    def region_of(self, index: int) -> int:
        return group_of(index, self.regions, self.nodes)

    @model_validator(mode="after")
    def _link_rate_needs_namespaces(self):
        if self.link_gbps is not None and self.isolation == "loopback":
            raise ValueError("link_gbps shapes netns links; loopback nodes are not shaped")
        return self
