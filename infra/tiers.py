"""Network tiers (1g, 10g, 25g): the sysctls and NCCL socket settings each node gets (MTU: its provider)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import FatpipeError
from .spec import DEFAULT_MAX_RTT_MS, TIER_GBPS

# TCP buffers hold twice the bandwidth-delay product (the kernel charges packet overhead to
# the buffer, so only about half of it is window) at the cluster's RTT budget. The default,
# 10 ms, is far above in-region RTTs (0.05-2 ms), so a queue that builds up during an
# all-reduce burst never caps the window; nodes across regions declare their farthest round
# trip (`max_rtt_ms`). Rounded up to a power of two and never below 8 MiB, so a profile only
# raises the kernel's own limits (tcp_rmem max 6 MiB, tcp_wmem max 4 MiB).
MIN_BUFFER = 8 << 20

# Packets queued per CPU before the NIC's softirq drops them; a 10G+ NIC outruns the 1000 default.
NETDEV_BACKLOG = {"1g": 5000, "10g": 30000, "25g": 100000}

# NCCL's socket transport: threads per peer connection x sockets per thread (product <= 64).
# One TCP flow fills 1 Gbit/s; faster links need parallel flows to spread over NIC queues
# and CPU cores (NCCL's docs suggest 4 x 4 for 100G-class networks).
NCCL_SOCKETS = {"1g": (1, 2), "10g": (2, 4), "25g": (4, 4)}


def buffer_bytes(gbps: float, rtt_budget_ms: float = DEFAULT_MAX_RTT_MS) -> int:
    """The TCP buffer ceiling for a link of `gbps`: 2 x BDP at `rtt_budget_ms`, a power of two."""
    need = max(int(2 * gbps * 1e9 / 8 * rtt_budget_ms / 1000), MIN_BUFFER)
    return 1 << (need - 1).bit_length()


@dataclass(frozen=True)
class TierProfile:
    """What a tier declares on every node; `fatpipe wait` compares the node's read-back to it."""

    name: str
    gbps: int
    sysctls: dict[str, str] = field(repr=False, hash=False)  # name -> value as `sysctl -n` prints it
    nccl: dict[str, str] = field(repr=False, hash=False)  # NCCL_* settings for env and nccl.conf


def tier_profile(tier: str, rtt_budget_ms: float = DEFAULT_MAX_RTT_MS) -> TierProfile:
    """The profile of tier `tier` ("1g", "10g" or "25g"), its buffers sized for `rtt_budget_ms`."""
    if tier not in TIER_GBPS:
        raise ValueError(f"unknown tier {tier!r}; allowed: {', '.join(TIER_GBPS)}")
    gbps = TIER_GBPS[tier]
    size = buffer_bytes(gbps, rtt_budget_ms)
    sysctls = {
        "net.core.rmem_max": str(size),
        "net.core.wmem_max": str(size),
        # min, default, max: autotuning grows each socket up to max; rmem_max alone does not.
        "net.ipv4.tcp_rmem": f"4096 131072 {size}",
        "net.ipv4.tcp_wmem": f"4096 65536 {size}",
        "net.core.default_qdisc": "fq",  # BBR paces packets; fq does the pacing
        "net.ipv4.tcp_congestion_control": "bbr",
        "net.ipv4.tcp_mtu_probing": "1",  # find the working MTU when ICMP is blocked
        "net.core.netdev_max_backlog": str(NETDEV_BACKLOG[tier]),
        # Gradient sync is bursty: keep the congestion window across the idle compute phase.
        "net.ipv4.tcp_slow_start_after_idle": "0",
    }
    threads, socks = NCCL_SOCKETS[tier]
    nccl = {
        "NCCL_SOCKET_NTHREADS": str(threads),
        "NCCL_NSOCKS_PERTHREAD": str(socks),
        "NCCL_IB_DISABLE": "1",  # no InfiniBand on these networks: go straight to sockets
    }
    return TierProfile(tier, gbps, sysctls, nccl)  # fresh dicts each call: callers may edit them


def cluster_profile(cluster) -> TierProfile:
    """A cluster's tier profile, its buffers sized for the round trip it declares."""
    return tier_profile(cluster.tier, cluster.rtt_budget_ms)


def tier_name(gbps: float) -> str:
    """The tier ("1g", "10g", "25g") of an outputs' tier_gbps."""
    for name, value in TIER_GBPS.items():
        if value == gbps:
            return name
    raise FatpipeError(f"no tier of {gbps:g} Gbit/s; tiers: {', '.join(TIER_GBPS)}")


def normalize_sysctl(value: str) -> str:
    """`sysctl -n` separates tcp_rmem's fields with tabs; compare with single spaces."""
    return " ".join(str(value).split())


def sysctl_mismatches(declared: dict, observed: dict) -> list[str]:
    """One line per declared sysctl whose read-back value differs (or is missing)."""
    problems = []
    for name, want in declared.items():
        got = observed.get(name)
        if got is None:
            problems.append(f"{name}: not read back (want {want})")
        elif normalize_sysctl(got) != normalize_sysctl(want):
            problems.append(f"{name}: {normalize_sysctl(got)} (want {want})")
    return problems
