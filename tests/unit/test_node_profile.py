"""The node profile: cloud-init user data per provider and tier (no cdktf: these run in milliseconds)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from fatpipe.infra import node
from fatpipe.infra.clusters import AwsCluster, DigitalOceanCluster, SimCluster
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.tiers import tier_profile
from fatpipe.stacks.node_profile import render_cloud_init
from fatpipe.stacks.providers import PROVIDERS


def user_data(provider: str, cluster, tier: str) -> str:
    """The user data `provider` renders for `cluster` at `tier`."""
    return PROVIDERS[provider].user_data(cluster.model_copy(update={"tier": tier}))


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
    doc = parsed(user_data("aws", aws_cluster, "10g"))
    written = files(doc)
    conf = written["/etc/sysctl.d/60-fatpipe.conf"]["content"]
    assert "net.ipv4.tcp_wmem = 4096 65536 33554432\n" in conf
    assert "tcp_bbr" in written["/etc/modules-load.d/fatpipe.conf"]["content"]
    # On AWS NCCL picks its own socket counts for ENA (2 x 8); the tier's would lower them.
    assert written["/etc/nccl.conf"]["content"] == "NCCL_IB_DISABLE=1\n"
    assert written["/usr/local/sbin/fatpipe-net"]["permissions"] == "0755"
    assert "WantedBy=multi-user.target" in written["/etc/systemd/system/fatpipe-net.service"]["content"]
    assert set(doc["packages"]) == {"htop", "iftop", "net-tools", "mtr-tiny", "iperf3", "rsync", "python3-venv"}
    commands = doc["runcmd"]
    assert ["sysctl", "--system"] in commands
    assert commands.index(["modprobe", "tcp_bbr"]) < commands.index(["sysctl", "--system"])
    assert commands[-1] == ["/usr/local/sbin/fatpipe-ready"]


def test_user_data_is_one_text_for_all_nodes_and_holds_no_secrets(aws_cluster):
    text = user_data("aws", aws_cluster, "1g")
    assert len(text.encode()) < 16 * 1024
    assert "10.42.0.10" not in text  # each node finds its own NIC; no per-node values inside
    assert "ssh-ed25519" not in text and "PRIVATE KEY" not in text


def test_user_data_over_the_provider_limit_is_refused(aws_cluster):
    with pytest.raises(FatpipeError, match="user data for east is .* bytes; aws allows 1000"):
        render_cloud_init(aws_cluster, mtu=9001, limit=1000)


def test_mtu_is_jumbo_only_where_the_provider_allows_it():
    assert (PROVIDERS["aws"].mtu, PROVIDERS["digitalocean"].mtu, PROVIDERS["sim"].mtu) == (9001, 1500, 1500)


def test_net_script_finds_the_nic_that_holds_the_private_ip(aws_cluster):
    script = files(parsed(user_data("aws", aws_cluster, "10g")))["/usr/local/sbin/fatpipe-net"]["content"]
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
    script = files(parsed(user_data("aws", aws_cluster, "10g")))["/usr/local/sbin/fatpipe-ready"]["content"]
    ready, env, nccl = tmp_path / "ready", tmp_path / "net.env", tmp_path / "nccl.conf"
    env.write_text("FATPIPE_IFACE=lo\nFATPIPE_PRIVATE_IP=127.0.0.1\nNCCL_SOCKET_IFNAME=lo\n")
    nccl.write_text("NCCL_SOCKET_NTHREADS=2\nNCCL_SOCKET_IFNAME=lo\n")
    script = (script.replace(node.READY_FILE, str(ready)).replace(node.NET_ENV, str(env))
              .replace(node.NCCL_CONF, str(nccl)))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    doc = json.loads(ready.read_text())
    assert set(doc["sysctls"]) == set(tier_profile("10g").sysctls)
    assert (doc["iface"], doc["private_ip"], doc["tier"]) == ("lo", "127.0.0.1", "10g")
    assert isinstance(doc["mtu"], int) and doc["mtu"] > 0
    assert doc["nccl"]["NCCL_SOCKET_IFNAME"] == "lo"
    assert set(doc["packages"]) == {"htop", "iftop", "net-tools", "mtr-tiny", "iperf3", "rsync", "python3-venv"}
    assert isinstance(doc["qdisc"], list)
    if doc["sysctls"]["net.ipv4.tcp_rmem"] is not None:
        assert "\t" not in doc["sysctls"]["net.ipv4.tcp_rmem"]


def test_other_providers_get_the_tiers_nccl_sockets(aws_cluster):
    do = DigitalOceanCluster(provider="digitalocean", name="d", region="nyc3", nodes=2, tier="10g",
                             ssh_public_key=aws_cluster.ssh_public_key, ssh_cidr="203.0.113.7/32")
    written = files(parsed(PROVIDERS["digitalocean"].user_data(do)))
    assert written["/etc/nccl.conf"]["content"] == (
        "NCCL_SOCKET_NTHREADS=2\nNCCL_NSOCKS_PERTHREAD=4\nNCCL_IB_DISABLE=1\n")


def test_net_script_makes_nccl_exact_and_rebuilds_the_qdisc(aws_cluster):
    script = files(parsed(user_data("aws", aws_cluster, "1g")))["/usr/local/sbin/fatpipe-net"]["content"]
    assert 'echo "NCCL_SOCKET_IFNAME==$IFACE"' in script  # =ens5: exactly ens5, not ens50
    assert "GLOO_SOCKET_IFNAME=%s" in script  # gloo takes one exact name, no =
    assert 'mq) tc qdisc del dev "$IFACE" root' in script
    assert 'noqueue|"") tc qdisc replace dev "$IFACE" root fq' in script  # a shaper (tbf) stays
    assert script.index("qdisc del") > script.index('mtu "$MTU"')


def test_digitalocean_and_sim_render_too():
    sim = SimCluster(provider="sim", name="demo", nodes=2, private_cidr="10.9.0.0/24")
    script = files(parsed(user_data("sim", sim, "1g")))["/usr/local/sbin/fatpipe-net"]["content"]
    assert "CIDR=10.9.0.0/24\nMTU=1500\n" in script
