"""The `vm` provider's cluster: local QEMU VMs booted with a cloud's own user data (docs/ARCHITECTURE.md,
"The vm provider")."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import Field, model_validator

from .spec import LocalCluster, group_of

# The login of the image's cloud-init default user (Debian's cloud.cfg): the seed's key goes there.
VM_LOGIN = "debian"
# A cross-region rate gives each far peer its own netem under the guest's prio qdisc, whose 16
# bands leave 15 beside the default (stacks/vm/seed.py, MAX_PEER_DELAYS).
MAX_RATED_PEERS = 15


class VmCluster(LocalCluster):
    """N VMs on this machine, on a bridge, each configured by the user data a cloud renders."""

    provider: Literal["vm"]
    nodes: int = Field(2, ge=1, le=64)
    # Whose cloud-init user data the VMs boot with (the renderer of that provider, its MTU).
    user_data: Literal["aws", "digitalocean"] = "aws"
    vcpus: int = Field(1, ge=1, le=64)
    memory_mib: int = Field(1024, ge=512, le=1024 * 1024)
    # auto: KVM when a bounded probe boots the kernel with it, else software emulation (TCG).
    accel: Literal["auto", "kvm", "tcg"] = "auto"
    # A round trip between two VMs of one region (a cross-region link rehearsed): netem inside
    # the guests. With `regions`, the nodes split into that many consecutive groups (node i is in
    # region i * regions // nodes) and two VMs of different regions see `cross_region_rtt_ms`.
    rtt_ms: float = Field(0, ge=0, le=1000)
    regions: int = Field(1, ge=1, le=64)
    cross_region_rtt_ms: float | None = Field(None, ge=0, le=1000)
    # The rate between two VMs of different regions, per pair and direction: netem's `rate` on
    # the peer's own class in the receiving guest (stacks/vm/seed.py).
    cross_region_gbps: float | None = Field(None, ge=0.001, le=100)
    ssh_user: str = VM_LOGIN  # the taps are shaped to link_rate_gbps

    @property
    def rtt_budget_ms(self) -> float:
        """The buffers cover the longest round trip the guests' netem adds, whatever `max_rtt_ms` says."""
        return max(super().rtt_budget_ms, self.rtt_ms, self.cross_region_rtt_ms or 0)

    @model_validator(mode="after")
    def _regions_fit(self):
        if self.regions > self.nodes:
            raise ValueError(f"regions = {self.regions}: more regions than nodes ({self.nodes})")
        if self.regions == 1 and self.cross_region_rtt_ms is not None:
            raise ValueError("cross_region_rtt_ms: needs regions >= 2 (one region has no cross-region link)")
        if self.regions > 1 and self.cross_region_rtt_ms is None:
            raise ValueError(f"regions = {self.regions}: give cross_region_rtt_ms, the round trip between regions")
        if self.cross_region_gbps is not None:
            if self.regions == 1:
                raise ValueError("cross_region_gbps: needs regions >= 2 (one region has no cross-region link)")
            if self.cross_region_gbps > self.link_rate_gbps:
                raise ValueError(f"cross_region_gbps = {self.cross_region_gbps:g}: above the links' "
                                 f"{self.link_rate_gbps:g} Gbit/s, it would limit nothing")
            far = self.nodes - min(Counter(map(self.region_of, range(self.nodes))).values())
            if far > MAX_RATED_PEERS:
                raise ValueError(f"cross_region_gbps: a VM would have {far} peers in other regions, each its own "
                                 f"class; at most {MAX_RATED_PEERS} (fewer nodes, or more in each region)")
        return self

    def region_of(self, index: int) -> int:
        return group_of(index, self.regions, self.nodes)

    def peer_rtt_ms(self, index: int) -> dict[str, float]:
        """Node `index`'s peers whose round trip is not `rtt_ms`, by private IP: what its guest
        delays apart from the default (empty for one region, so its seed is unchanged)."""
        theirs = {self.private_ip(peer): self.rtt_ms if self.region_of(peer) == self.region_of(index)
                  else self.cross_region_rtt_ms for peer in range(self.nodes) if peer != index}
        return {ip: rtt for ip, rtt in theirs.items() if rtt != self.rtt_ms}

    def peer_gbps(self, index: int) -> dict[str, float]:
        """Node `index`'s peers in other regions and the rate each may send it, by private IP (empty
        without `cross_region_gbps`)."""
        if self.cross_region_gbps is None:
            return {}
        return {self.private_ip(peer): self.cross_region_gbps for peer in range(self.nodes)
                if self.region_of(peer) != self.region_of(index)}

    def output(self, nodes: list[dict], **extra) -> dict:
        """In regions, each node names its own ("r0", "r1"...) and the cluster its cross-region rate;
        one region's output is as it always was."""
        if self.regions > 1:
            nodes = [{**node, "region": f"r{self.region_of(i)}"} for i, node in enumerate(nodes)]
            extra = {**extra, "cross_region_gbps": self.cross_region_gbps}
        return super().output(nodes, **extra)
