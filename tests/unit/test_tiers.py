"""Tier profiles: buffers, sockets and the read-back comparison."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra.tiers import buffer_bytes, normalize_sysctl, sysctl_mismatches, tier_profile

REQUIRED = {
    "net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.core.default_qdisc", "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_mtu_probing",
    "net.core.netdev_max_backlog", "net.ipv4.tcp_slow_start_after_idle",
}


@pytest.mark.parametrize("tier,size", [("1g", 8 << 20), ("10g", 32 << 20), ("25g", 64 << 20)])
def test_buffers_cover_twice_the_bdp_at_the_rtt_budget(tier, size):
    profile = tier_profile(tier)
    assert set(profile.sysctls) == REQUIRED
    # 2 x bandwidth x 10 ms, a power of two, at least 8 MiB.
    assert size >= 2 * profile.gbps * 1e9 / 8 * 0.010 and size & (size - 1) == 0
    assert profile.sysctls["net.core.rmem_max"] == profile.sysctls["net.core.wmem_max"] == str(size)
    # Autotuning's ceiling is the third field; rmem_max alone would not raise it.
    assert profile.sysctls["net.ipv4.tcp_rmem"].split()[2] == str(size)
    assert profile.sysctls["net.ipv4.tcp_wmem"].split()[2] == str(size)
    assert profile.sysctls["net.ipv4.tcp_congestion_control"] == "bbr"
    assert profile.sysctls["net.core.default_qdisc"] == "fq"
    assert profile.sysctls["net.ipv4.tcp_slow_start_after_idle"] == "0"
    assert profile.sysctls["net.ipv4.tcp_mtu_probing"] == "1"


def test_faster_tiers_get_more_sockets_backlog_and_buffer():
    one, ten, twentyfive = (tier_profile(t) for t in ("1g", "10g", "25g"))
    for slow, fast in [(one, ten), (ten, twentyfive)]:
        assert int(fast.sysctls["net.core.netdev_max_backlog"]) > int(slow.sysctls["net.core.netdev_max_backlog"])
        flows = [int(p.nccl["NCCL_SOCKET_NTHREADS"]) * int(p.nccl["NCCL_NSOCKS_PERTHREAD"]) for p in (slow, fast)]
        assert flows[1] > flows[0]
    for p in (one, ten, twentyfive):
        assert p.nccl["NCCL_IB_DISABLE"] == "1"
        assert int(p.nccl["NCCL_SOCKET_NTHREADS"]) * int(p.nccl["NCCL_NSOCKS_PERTHREAD"]) <= 64
    assert buffer_bytes(100) == 256 << 20


def test_profiles_are_fresh_dicts_and_unknown_tiers_refused():
    tier_profile("1g").sysctls["net.core.rmem_max"] = "1"
    assert tier_profile("1g").sysctls["net.core.rmem_max"] == str(8 << 20)
    json.dumps(tier_profile("1g").sysctls)  # plain dicts
    with pytest.raises(ValueError, match="unknown tier"):
        tier_profile("100g")


def test_read_back_comparison_ignores_sysctl_tabs():
    declared = tier_profile("10g").sysctls
    observed = {k: v.replace(" ", "\t") for k, v in declared.items()}
    assert normalize_sysctl("4096\t131072\t33554432\n") == "4096 131072 33554432"
    assert sysctl_mismatches(declared, observed) == []
    observed["net.ipv4.tcp_congestion_control"] = "cubic"
    del observed["net.core.default_qdisc"]
    problems = sysctl_mismatches(declared, observed)
    assert "net.ipv4.tcp_congestion_control: cubic (want bbr)" in problems
    assert any(p.startswith("net.core.default_qdisc: not read back") for p in problems)


def test_buffers_cover_the_declared_round_trip():
    """A cross-region round trip gets buffers of twice its bandwidth-delay product (half of a
    buffer is window): 1 Gbit/s at 100 ms is a 12.5 MB BDP, so 32 MiB; 10 ms stays at 8 MiB."""
    assert tier_profile("1g").sysctls["net.core.rmem_max"] == str(8 << 20)
    far = tier_profile("1g", rtt_budget_ms=100).sysctls
    assert far["net.core.rmem_max"] == far["net.core.wmem_max"] == str(32 << 20)
    assert far["net.ipv4.tcp_rmem"].split()[-1] == str(32 << 20)
    assert buffer_bytes(1, rtt_budget_ms=50) == 16 << 20
