"""Tier profiles and the cloud-init renderer (no cdktf: these run in milliseconds)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from fatpipe.infra import cloud_init
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.spec import AwsCluster, SimCluster
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


def test_mtu_is_jumbo_only_where_the_provider_allows_it():
    profile = tier_profile("10g")
    assert (profile.mtu("aws"), profile.mtu("digitalocean"), profile.mtu("sim")) == (9001, 1500, 1500)


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


# -- cloud-init ------------------------------------------------------------------------------

@pytest.fixture
def aws_cluster(tmp_path):
    key = tmp_path / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITest test\n")
    return AwsCluster(provider="aws", name="east", region="us-east-1", nodes=4, tier="10g",
                      ssh_public_key=str(key), ssh_cidr="203.0.113.7/32")


def parsed(text: str) -> dict:
    head, body = text.split("\n", 1)
    assert head == "#cloud-config"
    return json.loads(body)  # JSON is YAML: cloud-init reads it as is


def files(doc: dict) -> dict[str, dict]:
    return {f["path"]: f for f in doc["write_files"]}


def test_user_data_has_sysctls_bbr_nccl_packages_and_a_ready_step_last(aws_cluster):
    doc = parsed(cloud_init.render_cloud_init("10g", "aws", aws_cluster))
    written = files(doc)
    conf = written["/etc/sysctl.d/60-fatpipe.conf"]["content"]
    assert "net.ipv4.tcp_wmem = 4096 65536 33554432\n" in conf
    assert "tcp_bbr" in written["/etc/modules-load.d/fatpipe.conf"]["content"]
    assert written["/etc/nccl.conf"]["content"] == (
        "NCCL_SOCKET_NTHREADS=2\nNCCL_NSOCKS_PERTHREAD=4\nNCCL_IB_DISABLE=1\n")
    assert written["/usr/local/sbin/fatpipe-net"]["permissions"] == "0755"
    assert "WantedBy=multi-user.target" in written["/etc/systemd/system/fatpipe-net.service"]["content"]
    assert set(doc["packages"]) == {"htop", "iftop", "net-tools", "mtr-tiny", "iperf3", "rsync", "python3-venv"}
    commands = doc["runcmd"]
    assert ["sysctl", "--system"] in commands
    assert commands.index(["modprobe", "tcp_bbr"]) < commands.index(["sysctl", "--system"])
    assert commands[-1] == ["/usr/local/sbin/fatpipe-ready"]


def test_user_data_is_one_text_for_all_nodes_and_holds_no_secrets(aws_cluster):
    text = cloud_init.render_cloud_init("1g", "aws", aws_cluster)
    assert len(text.encode()) < 16 * 1024
    assert "10.42.0.10" not in text  # each node finds its own NIC; no per-node values inside
    assert "ssh-ed25519" not in text and "PRIVATE KEY" not in text


def test_user_data_over_the_provider_limit_is_refused(aws_cluster, monkeypatch):
    monkeypatch.setitem(cloud_init.USER_DATA_LIMIT, "aws", 1000)
    with pytest.raises(FatpipeError, match="user data for east is .* bytes; aws allows 1000"):
        cloud_init.render_cloud_init("1g", "aws", aws_cluster)


def test_net_script_finds_the_nic_that_holds_the_private_ip(aws_cluster):
    script = files(parsed(cloud_init.render_cloud_init("10g", "aws", aws_cluster)))["/usr/local/sbin/fatpipe-net"]["content"]
    assert "CIDR=10.42.0.0/24\nMTU=9001\n" in script
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    finder = re.search(r"python3 -c '(.*?)' \"\$CIDR\"", script, re.S).group(1)
    # Loopback stands in for the private network: the finder must name `lo` and its address.
    found = subprocess.run([sys.executable, "-c", finder, "127.0.0.0/8"], capture_output=True, text=True)
    if "ip" in found.stderr and found.returncode:
        pytest.skip("no `ip -j` on this machine")
    assert found.stdout.split() == ["lo", "127.0.0.1"]
    missing = subprocess.run([sys.executable, "-c", finder, "127.255.255.254/32"], capture_output=True, text=True)
    assert missing.returncode != 0 and "no interface holds an address in 127.255.255.254/32" in missing.stderr


def test_ready_script_reads_back_values_as_json(aws_cluster, tmp_path):
    script = files(parsed(cloud_init.render_cloud_init("10g", "aws", aws_cluster)))["/usr/local/sbin/fatpipe-ready"]["content"]
    ready, env, nccl = tmp_path / "ready", tmp_path / "net.env", tmp_path / "nccl.conf"
    env.write_text("FATPIPE_IFACE=lo\nFATPIPE_PRIVATE_IP=127.0.0.1\nNCCL_SOCKET_IFNAME=lo\n")
    nccl.write_text("NCCL_SOCKET_NTHREADS=2\nNCCL_SOCKET_IFNAME=lo\n")
    script = (script.replace(cloud_init.READY_FILE, str(ready)).replace(cloud_init.NET_ENV, str(env))
              .replace(cloud_init.NCCL_CONF, str(nccl)))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    doc = json.loads(ready.read_text())
    assert set(doc["sysctls"]) == set(tier_profile("10g").sysctls)
    assert (doc["iface"], doc["private_ip"], doc["tier"]) == ("lo", "127.0.0.1", "10g")
    assert isinstance(doc["mtu"], int) and doc["mtu"] > 0
    assert doc["nccl"]["NCCL_SOCKET_IFNAME"] == "lo"
    if doc["sysctls"]["net.ipv4.tcp_rmem"] is not None:
        assert "\t" not in doc["sysctls"]["net.ipv4.tcp_rmem"]


def test_digitalocean_and_sim_render_too():
    sim = SimCluster(provider="sim", name="demo", nodes=2, private_cidr="10.9.0.0/24")
    script = files(parsed(cloud_init.render_cloud_init("1g", "sim", sim)))["/usr/local/sbin/fatpipe-net"]["content"]
    assert "CIDR=10.9.0.0/24\nMTU=1500\n" in script
