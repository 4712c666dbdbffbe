"""A sim cluster across regions: its keys are checked, each node's terraform input names its region
and the link's rates (node-down gets them too, so the region's uplink goes with its last node),
the outputs name the regions, and a one-region cluster's input is as it was."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fatpipe.infra.clusters import SimCluster
from fatpipe.stacks.providers.sim_stack import node_command, node_input
from fatpipe.stacks.sim.regions import FLOW_CLASSES, shaping_batch


def sim(**keys) -> SimCluster:
    return SimCluster(provider="sim", name="rg", nodes=4, tier="10g", isolation="netns", **keys)


@pytest.mark.parametrize("keys, message", [
    ({"regions": 2}, "regions = 2: give cross_region_gbps"),
    ({"cross_region_gbps": 1.0}, "cross_region_gbps: needs regions >= 2"),
    ({"regions": 5, "cross_region_gbps": 1.0}, "more regions than nodes"),
    ({"regions": 2, "cross_region_gbps": 0.2, "cross_region_flow_gbps": 0.5}, "above cross_region_gbps"),
])
def test_bad_region_keys_are_one_line_naming_the_key(keys, message):
    with pytest.raises(ValidationError, match=message):
        sim(**keys)


def test_each_node_knows_its_region_and_the_link_between_regions():
    cluster = sim(regions=2, cross_region_gbps=0.2, cross_region_flow_gbps=0.05)
    inputs = [node_input(cluster, i, "netns") for i in range(4)]
    assert [n["region"] for n in inputs] == [0, 0, 1, 1]
    assert inputs[0]["bridge"] != inputs[2]["bridge"] and inputs[0]["bridge"] == inputs[1]["bridge"]
    assert {(n["cross_gbit"], n["flow_gbit"]) for n in inputs} == {(0.2, 0.05)}
    extra = ("region", "cross_gbit", "flow_gbit")
    assert "--region=${self.input.region}" in node_command("down", extra)


def test_one_region_keeps_its_input_and_bridge():
    inputs = node_input(sim(), 2, "netns")
    assert not {"region", "cross_gbit", "flow_gbit"} & set(inputs)
    assert inputs["bridge"] == node_input(sim(regions=2, cross_region_gbps=1.0), 0, "netns")["bridge"]


def test_the_per_flow_cap_gives_each_port_pair_a_class_under_the_links():
    lines = shaping_batch("fpu-x", 0.2, 0.05).splitlines()
    assert "rate 200000000bit ceil 200000000bit" in lines[1]
    flow_classes = [line for line in lines if "parent 1:1 classid" in line]
    assert len(flow_classes) == FLOW_CLASSES and all("rate 50000000bit" in c for c in flow_classes)
    # Every (source, destination) port bucket leads to one of those classes.
    leaves = [line for line in lines if "flowid 1:" in line]
    assert len(leaves) == FLOW_CLASSES * FLOW_CLASSES
    assert len(shaping_batch("fpu-x", 0.2, None).splitlines()) == 2  # no cap: the link's class only
