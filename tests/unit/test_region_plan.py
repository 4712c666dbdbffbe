"""`fatpipe plan --span regions`: the two levels the trainer decides across regions, from planned
links: a hook inside each region, DiLoCo between them on int8 at the smallest H within 5% of
the step (at least 50), and a step far below a flat ring's on the slow link."""

from __future__ import annotations

import json

from click.testing import CliRunner

from fatpipe.ops.plan.regionplan import predict_levels, traffic_of
from fatpipe.trainer.comm.costmodel import HookCost, choose_comm, int8_wire_bytes
from fatpipe.trainer.comm.decision import LinkEstimate

PARAMS = 124_000_000


def test_a_slow_link_between_regions_syncs_every_h_steps_on_int8():
    traffic = traffic_of(PARAMS, PARAMS // 100, gloo=False)
    intra, cross = LinkEstimate(10.0, 2e-4, "plan"), LinkEstimate(1.0, 0.07, "plan")
    cost = HookCost({}, {}, 20_000)
    levels = predict_levels(intra, cross, 1.2, traffic, 4, 2, cost)
    assert levels.sync_every >= 50 and levels.usable
    # H is the smallest within the 5% budget: the int8 exchange over the link, per H steps.
    exchange = 0.07 + int8_wire_bytes(PARAMS) * 8 / 1e9
    assert exchange / levels.sync_every <= 0.05 / 0.95 * levels.step_s + 1e-9
    assert levels.outer_share <= 0.05 and levels.method.endswith(f"diloco/{levels.sync_every} int8")
    flat = choose_comm(cross, 1.2, 1, traffic, 4, cost=cost)
    assert levels.step_s < 0.5 * flat.predicted["none"]["step_s"]


def test_one_node_per_region_sends_nothing_inside_one():
    traffic = traffic_of(PARAMS, PARAMS // 100, gloo=False)
    levels = predict_levels(LinkEstimate(10.0, 2e-4, "plan"), LinkEstimate(0.2, 0.07, "plan"), 1.2,
                            traffic, 2, 2, HookCost({}, {}, 20_000))
    assert levels.inner == "none" and levels.inner_share == 0.0


def test_plan_span_regions_names_both_levels():
    from fatpipe.cli.main import cli as main

    done = CliRunner().invoke(main, ["plan", "--span", "regions", "--auto-periodic", "--catalog", "aws",
                                     "--nodes", "4", "--json", "--top", "2"])
    assert done.exit_code == 0, done.output
    rows = json.loads(done.output)
    rows = rows["plans"]
    assert rows and all("| diloco/" in row["method"] and "int8" in row["method"] for row in rows), rows
    assert all("2 regions of 2 node(s)" in row["reason"] for row in rows)


def test_plan_splits_the_nodes_into_the_regions_asked():
    from fatpipe.cli.main import cli as main

    done = CliRunner().invoke(main, ["plan", "--span", "regions", "--regions", "3", "--auto-periodic", "--catalog",
                                     "aws", "--nodes", "2-6", "--json", "--top", "20"])
    assert done.exit_code == 0, done.output
    rows = json.loads(done.output)["plans"]
    assert rows and {row["nodes"] for row in rows} <= {3, 4, 5, 6}, rows  # no fewer nodes than regions
    six = [row for row in rows if row["nodes"] == 6]
    assert six and all("3 regions of 2 node(s)" in row["reason"] for row in six), six
    for args, why in ((["--regions", "3"], "--regions 3 needs --span regions"),
                      (["--span", "regions", "--regions", "1"], "--regions must be 2 or more"),
                      (["--span", "regions", "--regions", "9"], "at most the largest node count (8)")):
        refused = CliRunner().invoke(main, ["plan", "--catalog", "aws", *args])
        assert refused.exit_code == 2 and why in refused.output, refused.output
