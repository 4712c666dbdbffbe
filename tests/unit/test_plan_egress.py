"""`fatpipe plan` across regions or the internet: AWS's egress cap and per-flow limit outside
a placement group (EC2 User Guide, "Amazon EC2 instance network bandwidth")."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra.catalog import load_catalog
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.jobmodel import ACCELERATORS, Job, egress_cap_gbps, plan_link
from fatpipe.ops.plan import plan as planner

AWS = load_catalog("aws")
DO = load_catalog("digitalocean")
GPU, CPU = ACCELERATORS["rtx4090"], ACCELERATORS["cpu"]


def test_outside_its_region_an_aws_node_gets_half_its_bandwidth_from_32_vcpus_else_5_gbit():
    big = AWS.types["g4dn.8xlarge"]  # 32 vCPUs, 50 Gbit/s baseline
    assert plan_link("aws", big, GPU, "10g", 10).gbps == 50.0
    across = plan_link("aws", big, GPU, "10g", 10, span="regions")
    assert (across.gbps, across.flow_cap_gbps, across.tier_unreachable) == (25.0, 25.0, False)
    small = AWS.types["g4dn.4xlarge"]  # 16 vCPUs
    assert plan_link("aws", small, GPU, "10g", 10, span="internet").gbps == 5.0
    assert egress_cap_gbps("aws", small, "region") is None
    # Half, or 5 Gbit/s where half is less: m5.8xlarge has 32 vCPUs and 10 Gbit/s.
    assert egress_cap_gbps("aws", AWS.types["c5.9xlarge"], "regions") == 6.0  # 36 vCPUs, 12
    assert egress_cap_gbps("aws", AWS.types["m5.8xlarge"], "regions") == 5.0


def test_no_placement_group_spans_regions_so_one_flow_carries_5():
    big = AWS.types["c6in.8xlarge"]  # in one placement group a gloo flow carries 10
    assert plan_link("aws", big, CPU, "10g", 10).gbps == 10.0
    across = plan_link("aws", big, CPU, "25g", 25, span="internet")
    assert (across.gbps, across.tier_unreachable) == (5.0, True)


def test_digitalocean_publishes_no_egress_cap_and_a_bad_span_is_refused():
    link = plan_link("digitalocean", DO.types["s-4vcpu-8gb-amd"], CPU, "10g", 10, span="regions")
    assert (link.gbps, link.flow_cap_gbps) == (10.0, None)
    with pytest.raises(ConfigError, match="span must be one of region, regions, internet"):
        plan_link("aws", AWS.types["c6in.8xlarge"], CPU, "10g", 10, span="planet")


def test_the_seeds_job_across_regions_is_slower_on_the_same_machines(run_cli):
    job = Job(124_000_000, 10 * 524_288)
    traffic = planner.model_traffic("124m")
    near, far = (planner.predict(job, GPU, traffic, planner.Candidate(
        "aws", AWS.types["g5.12xlarge"], "25g", 8, span=span)) for span in ("region", "regions"))
    assert far.link.gbps < near.link.gbps and far.step_s > near.step_s
    result = run_cli("plan", "--catalog", "aws", "--nodes", "8", "--span", "internet", "--json", "--top", "50")
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)["plans"]
    assert plans and all(p["span"] == "internet" and p["link_gbps"] <= 0.5 * p["baseline_gbps"] + 5 for p in plans)
