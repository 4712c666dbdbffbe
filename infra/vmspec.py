"""The `vm` provider's cluster: local QEMU VMs booted with a cloud's own user data (docs/ARCHITECTURE.md,
"The vm provider")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .spec import LocalCluster

# The login of the image's cloud-init default user (Debian's cloud.cfg): the seed's key goes there.
VM_LOGIN = "debian"


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
    # A round trip between the VMs (a cross-region link rehearsed): netem inside the guests.
    rtt_ms: float = Field(0, ge=0, le=1000)
    ssh_user: str = VM_LOGIN  # the taps are shaped to link_rate_gbps

    @property
    def rtt_budget_ms(self) -> float:
        """The buffers cover the round trip the guests' netem adds, whatever `max_rtt_ms` says."""
        return max(super().rtt_budget_ms, self.rtt_ms)
