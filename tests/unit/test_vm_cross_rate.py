"""A `vm` cluster in regions with `cross_region_gbps`: the key's checks, each guest's per-peer
netem with the rate, and the outputs' regions (docs/local-vms.md)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.outputs import parse_outputs
from fatpipe.stacks.vm.seed import (
    PEER_RTT_SCRIPT,
    kernel_sysctls_command,
    peer_delay_args,
    rated_band,
    vendor_data,
)

from .test_vm_regions import TWO_REGIONS, cluster, node_env, run_with_stub_tools, synth

RATED = TWO_REGIONS + "\ncross_region_gbps = 0.2"


@pytest.mark.parametrize("extra,message", [
    ("cross_region_gbps = 0.2", "cross_region_gbps: needs regions >= 2"),
    (RATED.replace("0.2", "2"), "cross_region_gbps = 2: above the links' 1 Gbit/s, it would limit nothing"),
    (RATED.replace("0.2", "0"), "greater than or equal to 0.001"),
    ("nodes = 31\nregions = 2\ncross_region_rtt_ms = 80\ncross_region_gbps = 0.2",
     "a VM would have 16 peers in other regions, each its own class; at most 15"),
])
def test_a_bad_cross_region_rate_is_one_line_naming_the_key(tmp_path, extra, message):
    with pytest.raises(ConfigError) as e:
        cluster(tmp_path, extra)
    problems = [line for line in str(e.value).splitlines() if "clusters.v" in line]
    assert len(problems) == 1 and "cross_region_gbps" in problems[0] and message in problems[0], str(e.value)


def test_fifteen_far_peers_fit():
    from fatpipe.infra.vmspec import VmCluster

    c = VmCluster(provider="vm", name="v", nodes=30, regions=2, cross_region_rtt_ms=80, cross_region_gbps=0.2)
    assert len(c.peer_gbps(0)) == 15 and c.peer_gbps(29) == {c.private_ip(i): 0.2 for i in range(15)}
    assert VmCluster(provider="vm", name="v", nodes=4, regions=2, cross_region_rtt_ms=80).peer_gbps(0) == {}


def test_each_far_peer_gets_its_own_rated_band():
    assert rated_band(80, 0.2) == "40ms/200000kbit/1334"  # a round trip at 0.2 Gbit/s in 1500-byte packets
    assert rated_band(1, 0.2) == "0.5ms/200000kbit/1000"  # never under a NIC's default queue
    assert peer_delay_args(1, {"10.93.0.13": 80, "10.93.0.12": 80, "10.93.0.14": 5},
                           {"10.93.0.13": 0.2, "10.93.0.12": 0.2}) == [
        "0.5ms", "2.5ms", "10.93.0.14", "40ms/200000kbit/1334", "10.93.0.12", "40ms/200000kbit/1334", "10.93.0.13"]
    # A far peer as near as the default still gets its rate.
    assert peer_delay_args(80, {}, {"10.93.0.12": 0.5}) == ["40ms", "40ms/500000kbit/3334", "10.93.0.12"]
    for bad in ({"10.93.0.12": 0}, {"10.93.0.12": float("nan")}, {"10.93.0.12": 101}, {"10.93.0.12;x": 0.2}):
        with pytest.raises(ValueError):
            peer_delay_args(1, {}, bad)
    with pytest.raises(ValueError, match="at most 15"):
        peer_delay_args(0, {}, {f"10.0.0.{i}": 0.2 for i in range(1, 17)})


def test_the_script_puts_the_rate_on_each_far_peers_netem(tmp_path):
    if not os.path.exists("/sys/class/net/lo/address"):
        pytest.skip("no /sys/class/net/lo")
    calls = run_with_stub_tools(tmp_path, peer_delay_args(1, {"10.93.0.12": 80, "10.93.0.13": 80},
                                                          {"10.93.0.12": 0.2, "10.93.0.13": 0.2}))
    assert calls == [
        "tc qdisc del dev fprtt0 root",
        "tc qdisc add dev fprtt0 root handle 1: prio bands 3 priomap" + " 0" * 16,
        "tc qdisc add dev fprtt0 parent 1:1 netem delay 0.5ms limit 100000",
        "tc qdisc add dev fprtt0 parent 1:2 netem delay 40ms rate 200000kbit limit 1334",
        "tc filter add dev fprtt0 parent 1: protocol ip prio 1 u32 match ip src 10.93.0.12/32 flowid 1:2",
        "tc qdisc add dev fprtt0 parent 1:3 netem delay 40ms rate 200000kbit limit 1334",
        "tc filter add dev fprtt0 parent 1: protocol ip prio 1 u32 match ip src 10.93.0.13/32 flowid 1:3",
    ]


def test_two_rated_regions_reach_the_guest_and_the_outputs(monkeypatch, tmp_path):
    """Stack input -> node-up's environment -> VmNode -> vendor data, and the cluster output."""
    from fatpipe.cli.vm import node_from_env

    nodes = synth(tmp_path, RATED)
    node = nodes["node-3"]
    up, down = (p["local-exec"] for p in node["provisioner"])
    assert "FATPIPE_VM_PEER_GBPS" in up["environment"] and "FATPIPE_VM_PEER_GBPS" not in down["environment"]
    assert json.loads(node["input"]["peer_gbps"]) == {"10.93.0.10": 0.2, "10.93.0.11": 0.2}
    node_env(monkeypatch, node["input"])
    monkeypatch.setenv("FATPIPE_VM_PEER_GBPS", node["input"]["peer_gbps"])
    vm = node_from_env()
    text = vendor_data(False, vm.mac, vm.rtt_ms, dict(vm.peer_rtt_ms), dict(vm.peer_gbps))
    rtt, snapshot = yaml.safe_load(text)["bootcmd"]
    assert snapshot == kernel_sysctls_command(vm.mac)
    assert rtt == ["sh", "-c", PEER_RTT_SCRIPT, "fatpipe-rtt", vm.mac, "0.5ms",
                   "40ms/200000kbit/1334", "10.93.0.10", "40ms/200000kbit/1334", "10.93.0.11"]
    monkeypatch.setenv("FATPIPE_VM_PEER_GBPS", '{"10.93.0.10": "0.2; reboot"}')
    with pytest.raises(FatpipeError, match=r"FATPIPE_VM_PEER_GBPS is not \{peer IPv4: rate Gbit/s\}"):
        node_from_env()


def stack_output(tmp_path, extra: str) -> dict:
    from fatpipe.stacks.app import build_stack
    from fatpipe.stacks.toolkit import Testing

    p = cluster(tmp_path, extra)
    return json.loads(Testing.synth(build_stack(Testing.app(), p.clusters["v"], p)))["output"]["cluster"]["value"]


def test_the_outputs_name_each_nodes_region_and_the_rate(tmp_path):
    outputs = parse_outputs(stack_output(tmp_path, RATED))
    assert [node.region for node in outputs.nodes] == ["r0", "r0", "r1", "r1"] and outputs.cross_region_gbps == 0.2
    unrated = parse_outputs(stack_output(tmp_path, TWO_REGIONS))
    assert [node.region for node in unrated.nodes] == ["r0", "r0", "r1", "r1"] and unrated.cross_region_gbps is None


def test_one_region_keeps_its_stack_and_outputs(tmp_path):
    nodes = synth(tmp_path, "nodes = 3\nrtt_ms = 40")
    for node in nodes.values():
        assert "peer_gbps" not in node["input"]
        assert not any("PEER_GBPS" in key for p in node["provisioner"] for key in p["local-exec"]["environment"])
    output = stack_output(tmp_path, "nodes = 3\nrtt_ms = 40")
    assert "cross_region_gbps" not in output and not any("region" in node for node in output["nodes"])
