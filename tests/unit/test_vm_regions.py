"""A `vm` cluster in regions: the keys, each node's round trips to its peers, and the fixed script
that delays each peer's packets in the guest (docs/ARCHITECTURE.md, "The vm provider")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.project import Project, parse_project
from fatpipe.stacks.vm.seed import (
    PEER_RTT_SCRIPT,
    RTT_SCRIPT,
    kernel_sysctls_command,
    peer_delay_args,
    vendor_data,
)

MAC = "52:54:00:00:00:01"
TWO_REGIONS = "nodes = 4\nregions = 2\nrtt_ms = 1\ncross_region_rtt_ms = 80"


def cluster(tmp_path, extra: str = ""):
    text = f'[clusters.v]\nprovider = "vm"\nprivate_cidr = "10.93.0.0/24"\n{extra}\n'
    (tmp_path / "fatpipe.toml").write_text(text)
    return Project(parse_project(text, "fatpipe.toml"), tmp_path, tmp_path / "fatpipe.toml")


@pytest.mark.parametrize("extra,key,message", [
    ("regions = 3", "regions", "more regions than nodes (2)"),
    ("cross_region_rtt_ms = 80", "cross_region_rtt_ms", "needs regions >= 2"),
    ("regions = 2", "cross_region_rtt_ms", "regions = 2: give cross_region_rtt_ms"),
    ("regions = 2\ncross_region_rtt_ms = 1001", "cross_region_rtt_ms", "less than or equal to 1000"),
    ("regions = 0", "regions", "greater than or equal to 1"),
])
def test_a_bad_regions_layout_is_one_line_naming_the_key(tmp_path, extra, key, message):
    with pytest.raises(ConfigError) as e:
        cluster(tmp_path, extra)
    problems = [line for line in str(e.value).splitlines() if "clusters.v" in line]
    assert len(problems) == 1 and key in problems[0] and message in problems[0], str(e.value)


def test_four_nodes_in_two_regions_delay_the_other_regions_pair():
    from fatpipe.infra.vmspec import VmCluster

    c = VmCluster(provider="vm", name="v", private_cidr="10.93.0.0/24", nodes=4, regions=2, rtt_ms=1,
                  cross_region_rtt_ms=80)
    assert [c.region_of(i) for i in range(4)] == [0, 0, 1, 1]
    far_from_first, far_from_second = {"10.93.0.12": 80, "10.93.0.13": 80}, {"10.93.0.10": 80, "10.93.0.11": 80}
    assert [c.peer_rtt_ms(i) for i in range(4)] == [far_from_first, far_from_first, far_from_second, far_from_second]


def test_three_nodes_in_two_regions_are_two_and_one():
    from fatpipe.infra.vmspec import VmCluster

    c = VmCluster(provider="vm", name="v", private_cidr="10.93.0.0/24", nodes=3, regions=2, cross_region_rtt_ms=50)
    assert [c.region_of(i) for i in range(3)] == [0, 0, 1]
    assert [c.peer_rtt_ms(i) for i in range(3)] == [
        {"10.93.0.12": 50}, {"10.93.0.12": 50}, {"10.93.0.10": 50, "10.93.0.11": 50}]
    # A cross-region round trip equal to the region's own leaves nothing apart from the default.
    same = VmCluster(provider="vm", name="v", nodes=3, regions=2, rtt_ms=50, cross_region_rtt_ms=50)
    assert [same.peer_rtt_ms(i) for i in range(3)] == [{}, {}, {}]


# Today's vendor data of a one-region VM with rtt_ms = 40, written out: it must not change.
TODAYS_RTT_SCRIPT = """set -e
nic=
for d in /sys/class/net/*; do [ "$(cat "$d/address")" = "$1" ] && nic=${d##*/}; done
[ -n "$nic" ] || { echo "fatpipe rtt: no NIC with MAC $1" >&2; exit 1; }
ip link show fprtt0 >/dev/null 2>&1 || ip link add fprtt0 type ifb
ip link set fprtt0 mtu "$(cat /sys/class/net/$nic/mtu)" up
tc qdisc replace dev "$nic" handle ffff: ingress
tc filter replace dev "$nic" parent ffff: protocol all prio 1 matchall action mirred egress redirect dev fprtt0
tc qdisc replace dev fprtt0 root netem delay "$2" limit 100000
"""


def node_env(monkeypatch, node_input: dict) -> None:
    """node-up's environment as the stack's provisioner gives it (terraform passes strings)."""
    from fatpipe.stacks.vm.inputs import BOOT_KEYS, NODE_KEYS, VM_ENV_PREFIX

    for key in (*NODE_KEYS, *BOOT_KEYS):
        monkeypatch.setenv(f"{VM_ENV_PREFIX}{key.upper()}", str(node_input[key]))


def synth(tmp_path, extra: str) -> dict:
    from fatpipe.stacks.app import build_stack
    from fatpipe.stacks.toolkit import Testing

    p = cluster(tmp_path, extra)
    return json.loads(Testing.synth(build_stack(Testing.app(), p.clusters["v"], p)))["resource"]["terraform_data"]


def test_one_region_renders_todays_vendor_data_byte_for_byte(monkeypatch, tmp_path):
    from fatpipe.cli.vm import node_from_env

    nodes = synth(tmp_path, "rtt_ms = 40")
    for node in nodes.values():
        assert node["input"]["peer_rtt_ms"] == "{}"
        node_env(monkeypatch, node["input"])
        vm = node_from_env()
        assert vm.peer_rtt_ms == ()
        text = vendor_data(False, vm.mac, vm.rtt_ms, dict(vm.peer_rtt_ms))
        expected = {"bootcmd": [["sh", "-c", TODAYS_RTT_SCRIPT, "fatpipe-rtt", vm.mac, "20ms"],
                                kernel_sysctls_command(vm.mac)]}
        assert text == "#cloud-config\n" + json.dumps(expected, indent=1) + "\n"
    assert RTT_SCRIPT == TODAYS_RTT_SCRIPT
    assert vendor_data(False, MAC, 0, {}) == "#cloud-config\n" + json.dumps(
        {"bootcmd": [kernel_sysctls_command(MAC)]}, indent=1) + "\n"


def test_two_regions_reach_the_guest_script_as_arguments(monkeypatch, tmp_path):
    """Stack input -> node-up's environment -> VmNode -> vendor data: the far region's IPs after
    their delay, half of each round trip."""
    from fatpipe.cli.vm import node_from_env

    nodes = synth(tmp_path, TWO_REGIONS)
    far = {"node-0": ["10.93.0.12", "10.93.0.13"], "node-3": ["10.93.0.10", "10.93.0.11"]}
    for name, ips in far.items():
        node = nodes[name]
        up, down = (p["local-exec"] for p in node["provisioner"])
        assert "FATPIPE_VM_PEER_RTT_MS" in up["environment"] and "FATPIPE_VM_PEER_RTT_MS" not in down["environment"]
        assert json.loads(node["input"]["peer_rtt_ms"]) == dict.fromkeys(ips, 80)
        node_env(monkeypatch, node["input"])
        vm = node_from_env()
        rtt, snapshot = yaml.safe_load(vendor_data(False, vm.mac, vm.rtt_ms, dict(vm.peer_rtt_ms)))["bootcmd"]
        assert snapshot == kernel_sysctls_command(vm.mac)
        assert rtt == ["sh", "-c", PEER_RTT_SCRIPT, "fatpipe-rtt", vm.mac, "0.5ms", "40ms", *ips]


@pytest.mark.parametrize("value", ['{"10.93.0.12; reboot": 80}', '{"10.93.0.12": "80ms"}', '{"10.93.0.12": NaN}',
                                   '{"10.93.0.12": 1001}', '{"::1": 80}', '["10.93.0.12"]', "80"])
def test_node_up_refuses_a_peer_map_that_is_not_ips_and_round_trips(monkeypatch, tmp_path, value):
    from click.testing import CliRunner

    from fatpipe.cli.main import cli

    nodes = synth(tmp_path, TWO_REGIONS)
    node_env(monkeypatch, nodes["node-0"]["input"])
    monkeypatch.setenv("FATPIPE_VM_PEER_RTT_MS", value)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["vm", "node-up"])
    assert result.exit_code != 0 and "FATPIPE_VM_PEER_RTT_MS is not {peer IPv4: round trip ms}" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / ".fatpipe" / "v" / "nodes").exists(), result.output


def test_the_renderer_checks_every_peer_and_delay():
    assert peer_delay_args(1, {"10.0.0.3": 80, "10.0.0.2": 80.0, "10.0.0.9": 0.5, "10.0.0.4": 1}) == [
        "0.5ms", "0.25ms", "10.0.0.9", "40ms", "10.0.0.2", "10.0.0.3"]  # equal to the default: band 0
    for bad in ({"10.0.0.2 ": 80}, {"10.0.0.2/32": 80}, {"-v": 80}, {"10.0.0.2": float("nan")},
                {"10.0.0.2": -1}, {"10.0.0.2": "1e400"}):
        with pytest.raises(ValueError):
            peer_delay_args(1, bad)
    with pytest.raises(ValueError, match="at most 15"):
        peer_delay_args(0, {f"10.0.0.{i}": i for i in range(1, 17)})


def test_the_scripts_parse():
    for script in (RTT_SCRIPT, PEER_RTT_SCRIPT):
        proc = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def run_with_stub_tools(tmp_path, args: list[str]) -> list[str]:
    """Run PEER_RTT_SCRIPT with `ip` and `tc` that only log their arguments (this machine's
    kernel need not have ifb, prio or netem), on the NIC with lo's MAC; return tc's lines on the ifb."""
    stubs, log = tmp_path / "bin", tmp_path / "calls"
    stubs.mkdir(exist_ok=True)
    for tool in ("ip", "tc"):
        (stubs / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        (stubs / tool).chmod(0o755)
    log.write_text("")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", PEER_RTT_SCRIPT, "fatpipe-rtt", "00:00:00:00:00:00", *args], env=env, check=True)
    return [line for line in log.read_text().splitlines() if line.split()[:1] == ["tc"] and line.split()[3:5] == ["dev", "fprtt0"]]


def test_two_regions_script_builds_a_prio_tree_with_a_netem_per_delay(tmp_path):
    if not os.path.exists("/sys/class/net/lo/address"):
        pytest.skip("no /sys/class/net/lo")
    args = peer_delay_args(1, {"10.93.0.12": 80, "10.93.0.13": 80})
    calls = run_with_stub_tools(tmp_path, args)
    assert calls == [
        "tc qdisc del dev fprtt0 root",  # first, so each boot builds the same tree
        "tc qdisc add dev fprtt0 root handle 1: prio bands 2 priomap" + " 0" * 16,
        "tc qdisc add dev fprtt0 parent 1:1 netem delay 0.5ms limit 100000",
        "tc qdisc add dev fprtt0 parent 1:2 netem delay 40ms limit 100000",
        "tc filter add dev fprtt0 parent 1: protocol ip prio 1 u32 match ip src 10.93.0.12/32 flowid 1:2",
        "tc filter add dev fprtt0 parent 1: protocol ip prio 1 u32 match ip src 10.93.0.13/32 flowid 1:2",
    ]
    assert run_with_stub_tools(tmp_path, args) == calls  # a second boot: the same commands
    # Fifteen distinct delays: sixteen bands, whose classes tc reads in hex (1:10 is band 16).
    many = run_with_stub_tools(tmp_path, peer_delay_args(0, {f"10.0.0.{i}": i for i in range(1, 16)}))
    assert "prio bands 16 priomap" in many[1] and many[-1].endswith("match ip src 10.0.0.15/32 flowid 1:10")
    assert "tc qdisc add dev fprtt0 parent 1:a netem delay 4.5ms limit 100000" in many


def test_two_regions_vendor_data_is_valid_cloud_config(tmp_path):
    if not shutil.which("cloud-init"):
        pytest.skip("cloud-init is not installed (Debian package cloud-init)")
    path = tmp_path / "vendor-data"
    path.write_text(vendor_data(True, MAC, 1, {"10.93.0.12": 80, "10.93.0.13": 80}))
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "Valid cloud-config" in proc.stdout, proc.stdout + proc.stderr


def test_a_peer_map_read_back_is_checked_before_vmnode():
    from fatpipe.cli.vm import peer_rtts

    assert peer_rtts('{"10.0.0.3": 80, "10.0.0.2": 0.5}') == (("10.0.0.2", 0.5), ("10.0.0.3", 80.0))
    with pytest.raises(FatpipeError, match="True is not a round trip"):
        peer_rtts('{"10.0.0.2": true}')
