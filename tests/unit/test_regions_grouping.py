"""Regions found from `netcheck --pairs`: the grouping of a measured link matrix, the declared
regions held against it, the gate holding cross-region pairs to the declared rate, and the
netcheck.json section (docs/netcheck.md, "Regions")."""

from __future__ import annotations

import io
import itertools
import json

import pytest

from fatpipe.infra.outputs import parse_outputs
from fatpipe.ops.net.check import NetcheckOptions, netcheck_doc
from fatpipe.ops.net.gate import LinkResult, PairResult, evaluate_gate
from fatpipe.ops.net.regions import (
    REGION_GAP,
    CrossRegions,
    contradictions,
    measured_regions,
)
from fatpipe.ops.rdzv.regionenv import regions_from_doc
from fatpipe.trainer.net import bench as nb

MiB = 1 << 20


def names(n: int) -> list[str]:
    return [f"c-{i}" for i in range(n)]


def matrix(regions: list[int], inside: float, across: float, odd: dict | None = None) -> list[LinkResult]:
    """Every pair of len(regions) nodes: `inside` within a region, `across` between; `odd` maps a
    pair (i, j) to its own rate (None: the pair failed)."""
    odd = odd or {}
    links = []
    for i, j in itertools.combinations(range(len(regions)), 2):
        rate = odd.get((i, j), inside if regions[i] == regions[j] else across)
        links.append(LinkResult(f"c-{i}", f"c-{j}", {} if rate is None else {1: rate, 4: rate * 0.98},
                                error="connection refused" if rate is None else None))
    return links


@pytest.mark.parametrize("across", [1.0, 0.2])
def test_two_clear_regions(across):
    found = measured_regions(names(4), matrix([0, 0, 1, 1], 10.0, across))
    assert found.groups == [["c-0", "c-1"], ["c-2", "c-3"]]
    assert found.intra_gbps == 10.0 and found.cross_gbps == across and found.ratio == pytest.approx(10 / across)


def test_groups_take_node_order_not_the_order_of_the_regions():
    found = measured_regions(names(5), matrix([1, 0, 1, 0, 0], 9.4, 0.9))
    assert found.groups == [["c-0", "c-2"], ["c-1", "c-3", "c-4"]]


def test_three_regions():
    found = measured_regions(names(6), matrix([0, 0, 1, 1, 2, 2], 10.0, 1.0))
    assert found.groups == [["c-0", "c-1"], ["c-2", "c-3"], ["c-4", "c-5"]]


def test_one_region_when_the_links_are_alike():
    found = measured_regions(names(4), matrix([0, 0, 1, 1], 9.5, 9.5, odd={(0, 3): 8.0, (1, 2): 6.8}))
    assert found.groups == [names(4)] and found.why_one == "every link within 1.4x"
    assert found.cross_gbps is None and found.ratio is None


def test_one_region_when_the_ratio_is_below_k():
    below = REGION_GAP * 0.9
    found = measured_regions(names(4), matrix([0, 0, 1, 1], 10.0, 10.0 / below))
    assert found.groups == [names(4)] and found.why_one == f"every link within {below:.1f}x"
    # Just above the gap: two regions.
    assert len(measured_regions(names(4), matrix([0, 0, 1, 1], 10.0, 10.0 / (REGION_GAP * 1.1))).groups) == 2


def test_no_gap_of_k_between_spread_rates_is_one_region():
    rates = {(0, 1): 10.0, (0, 2): 5.0, (0, 3): 2.5, (1, 2): 1.25, (1, 3): 10.0, (2, 3): 5.0}
    found = measured_regions(names(4), matrix([0, 0, 0, 0], 10.0, 10.0, odd=rates))
    assert found.groups == [names(4)] and found.why_one.startswith("no clear grouping: the links spread from 1.25")


def test_a_failed_pair_is_a_slow_link():
    # Two regions whose cross links all failed: still two regions, nothing faster across.
    found = measured_regions(names(4), matrix([0, 0, 1, 1], 10.0, None))
    assert found.groups == [["c-0", "c-1"], ["c-2", "c-3"]] and found.cross_gbps == 0.0 and found.ratio is None
    # One failed pair in one region: its nodes' other links are fast, so nobody is split off.
    found = measured_regions(names(4), matrix([0, 0, 0, 0], 10.0, 10.0, odd={(1, 2): None}))
    assert found.groups == [names(4)] and "the fast links join every node" in found.why_one


def test_an_odd_slow_pair_inside_a_region_splits_nobody_off():
    """Decided: single linkage keeps a node whose other links are fast; the slow pair inside a group
    then fails the group's check, so the grouping is called unclear (the gate names the link)."""
    one = measured_regions(names(4), matrix([0, 0, 0, 0], 10.0, 10.0, odd={(0, 1): 1.0}))
    assert one.groups == [names(4)]
    noisy = measured_regions(names(6), matrix([0, 0, 0, 1, 1, 1], 10.0, 1.0, odd={(0, 1): 1.1}))
    assert noisy.groups == [names(6)]
    assert noisy.why_one == "no clear grouping: c-0 <-> c-1 at 1.10 Gbit/s is not 3x the 1.00 out of their group"


def test_too_few_nodes_or_pairs_decide_nothing():
    assert not measured_regions(names(2), matrix([0, 1], 10.0, 1.0)).decisive
    partial = measured_regions(names(4), matrix([0, 0, 1, 1], 10.0, 1.0)[1:])
    assert partial.groups == [names(4)] and not partial.decisive


DECLARED = {"r0": ["c-0", "c-1"], "r1": ["c-2", "c-3"]}


def test_the_declared_regions_agree_or_are_contradicted_by_name():
    assert contradictions(DECLARED, measured_regions(names(4), matrix([0, 0, 1, 1], 10.0, 1.0))) == []
    alike = measured_regions(names(4), matrix([0, 0, 1, 1], 9.5, 6.8))
    assert contradictions(DECLARED, alike) == [
        "declared regions r0=[c-0,c-1] r1=[c-2,c-3], measured one region: every link within 1.4x"]
    moved = measured_regions(names(4), matrix([0, 0, 0, 1], 10.0, 1.0))
    assert contradictions(DECLARED, moved) == [
        "c-2 declared in r1 but its links to r0 are as fast as inside r0",
        "r1 declared as one region but measured apart: [c-2] and [c-3]"]
    assert contradictions({"r0": names(4)}, moved) == [
        "declared one region r0=[c-0,c-1,c-2,c-3], measured r0=[c-0,c-1,c-2] r1=[c-3], "
        "links across at most 1.00 Gbit/s"]
    assert contradictions(None, moved) == []
    assert contradictions({"r0": ["c-0"], "r1": ["c-1"]}, measured_regions(names(2), matrix([0, 1], 10, 10))) == []


# --- the gate ------------------------------------------------------------------------------------


def crossing(gbps: float | None) -> CrossRegions:
    return CrossRegions({"c-0": "r0", "c-1": "r0", "c-2": "r1", "c-3": "r1"}, gbps, "declared")


def test_the_gate_holds_cross_pairs_to_the_declared_cross_region_rate():
    links = matrix([0, 0, 1, 1], 9.5, 0.9)
    # Against the tier every cross link fails; against a declared 1 Gbit/s between regions none does.
    assert len(evaluate_gate(10, 0.95, 256 * MiB, [], links=links).reasons) == 5  # 4 links and busbw
    gate = evaluate_gate(10, 0.95, 256 * MiB, [], links=links, regions=crossing(1.0))
    # A flat ring across regions is reported, not judged (gate.Bars.ring).
    assert gate.passed and gate.notes == ["all-reduce busbw 0.95 Gbit/s crosses regions: a flat ring, not judged"]
    slow = matrix([0, 0, 1, 1], 9.5, 0.9, odd={(1, 3): 0.5})
    gate = evaluate_gate(10, 0.95, 256 * MiB, [], links=slow, regions=crossing(1.0))
    assert gate.reasons == ["link c-1 <-> c-3: 0.50 Gbit/s is below 0.80 x 1 Gbit/s across regions"]
    # Inside a region the tier still holds.
    inside = matrix([0, 0, 1, 1], 9.5, 0.9, odd={(2, 3): 5.0})
    assert evaluate_gate(10, 0.95, 256 * MiB, [], links=inside, regions=crossing(1.0)).reasons == [
        "link c-2 <-> c-3: 5.00 Gbit/s is below 0.80 x 10 Gbit/s"]
    # The p2p pairs to node 0 too.
    pairs = [PairResult("c-0", "c-1", {1: 9.4}), PairResult("c-0", "c-2", {1: 0.95}), PairResult("c-0", "c-3", {1: 0.3})]
    assert evaluate_gate(10, 0.95, 256 * MiB, pairs, regions=crossing(1.0)).reasons == [
        "node c-3: p2p 0.30 Gbit/s to c-0 is below 0.80 x 1 Gbit/s across regions (1 stream 0.30)"]


def test_without_a_declared_rate_cross_pairs_are_reported_not_failed():
    gate = evaluate_gate(10, 0.95, 256 * MiB, [], links=matrix([0, 0, 1, 1], 9.5, 0.9, odd={(0, 1): None}),
                         regions=crossing(None))
    assert gate.reasons == ["link c-0 <-> c-1 failed: connection refused"]
    assert len(gate.notes) == 5 and gate.notes[0] == (
        "link c-0 <-> c-2: 0.90 Gbit/s not judged: the cluster declares no cross_region_gbps")
    assert gate.notes[-1].startswith("all-reduce busbw 0.95 Gbit/s crosses regions")


# --- netcheck.json --------------------------------------------------------------------------------


def outputs(regions: list[str | None], cross_gbps: float | None = None):
    return parse_outputs({
        "name": "c", "provider": "sim", "tier_gbps": 10, "private_cidr": "10.72.0.0/24",
        "cross_region_gbps": cross_gbps,
        "nodes": [{"name": f"c-{i}", "private_ip": f"10.72.0.{10 + i}", "transport": "netns", "netns": f"fp-c-{i}",
                   "region": region} for i, region in enumerate(regions)],
    })


def bench(links: list[LinkResult], busbw: float = 0.95) -> dict:
    rows = [nb.sweep_row(MiB, MiB * 8 * nb.bus_factor(4) / (busbw * 1e9), 4, 5, 20)]
    return {"backend": "gloo", "world_size": 4, "nnodes": 4, "allreduce": rows, "busbw_gbps": busbw,
            "busbw_size": MiB, "latency_s": 3e-4, "latency_bytes": 4, "p2p": None,
            "pairs": {"tool": "iperf3", "seconds": 1.0, "streams": [1, 4], "rounds": [], "links": [
                {"a": link.a, "a_ip": f"10.72.0.{10 + int(link.a[-1])}", "a_node": int(link.a[-1]),
                 "b": link.b, "b_ip": f"10.72.0.{10 + int(link.b[-1])}", "b_node": int(link.b[-1]),
                 "gbps_by_streams": {str(n): g for n, g in link.gbps_by_streams.items()}, "error": link.error,
                 "rtt_p50_s": 1e-4, "jitter_s": 1e-5} for link in links]}}


def test_netcheck_json_has_the_regions_and_judges_by_them():
    doc = netcheck_doc(bench(matrix([0, 0, 1, 1], 9.5, 0.9)), outputs(["r0", "r0", "r1", "r1"], 1.0),
                       NetcheckOptions(pairs=True))
    regions = json.loads(json.dumps(doc))["regions"]
    assert regions == {"k": REGION_GAP, "groups": [["c-0", "c-1"], ["c-2", "c-3"]], "intra_gbps": 9.5,
                       "cross_gbps": 0.9, "ratio": pytest.approx(9.5 / 0.9), "why_one": None,
                       "declared": DECLARED, "declared_cross_gbps": 1.0, "judged_by": "declared", "contradicts": []}
    assert doc["gate"]["passed"] and not any(link["slow"] for link in doc["pairs"]["links"])
    assert regions_from_doc(doc) == [["c-0", "c-1"], ["c-2", "c-3"]]
    # Without --pairs: no section, and the declared regions still judge.
    assert netcheck_doc({**bench([]), "pairs": None}, outputs(["r0", "r0", "r1", "r1"], 1.0),
                        NetcheckOptions())["regions"] is None
    assert regions_from_doc({"regions": None}) is None and regions_from_doc({"regions": {"groups": [["a"], 3]}}) is None


def test_measured_regions_judge_where_only_the_rate_is_declared():
    links = matrix([0, 0, 1, 1], 9.5, 0.9)
    doc = netcheck_doc(bench(links), outputs([None] * 4, 1.0), NetcheckOptions(pairs=True))
    assert doc["regions"]["judged_by"] == "measured" and doc["gate"]["passed"]
    # Nothing declared: the measured split is shown, and the gate holds every pair to the tier.
    doc = netcheck_doc(bench(links), outputs([None] * 4), NetcheckOptions(pairs=True))
    assert doc["regions"]["judged_by"] is None and doc["regions"]["contradicts"] == []
    assert not doc["gate"]["passed"] and len(doc["pairs"]["slow"]) == 4


def test_a_contradiction_is_a_warning_in_the_summary_not_a_failure():
    from rich.console import Console

    from fatpipe.cli.render import netcheck_tables

    doc = netcheck_doc(bench(matrix([0, 0, 0, 0], 9.5, 9.5, odd={(0, 3): 6.8}), busbw=9.0),
                       outputs(["r0", "r0", "r1", "r1"], 1.0), NetcheckOptions(pairs=True))
    assert doc["gate"]["passed"] and doc["regions"]["contradicts"]
    buf = io.StringIO()
    netcheck_tables(doc, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "regions measured: one (every link within 1.4x)" in text
    assert "warning: declared regions r0=[c-0,c-1] r1=[c-2,c-3], measured one region: every link within 1.4x" in text
    assert "netcheck passed" in text
