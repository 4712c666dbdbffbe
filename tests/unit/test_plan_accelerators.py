"""`fatpipe plan` knows the machines' GPUs: each type at its own GPUs' sourced figure, one forced
with --accelerator, a GPU without a figure listed and not ranked, a multi-GPU node as ranks that
sum inside it before the ring across nodes, and catalogs from before kinds were recorded."""

from __future__ import annotations

import json

import pytest

from fatpipe.cli.cluster_commands import _ACCELERATORS
from fatpipe.infra import catalog
from fatpipe.infra.accelerators import (
    ACCELERATORS,
    DATASHEETS,
    RTX4090,
    derive,
    missing_figure,
    node_accelerator,
)
from fatpipe.infra.catalog import gpu_kind, load_catalog
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.jobmodel import (
    IN_NODE_GBPS,
    REFERENCE_PARAMS,
    Job,
    plan_link,
    ring_allreduce_bytes,
)
from fatpipe.ops.plan import plan as planner
from fatpipe.trainer.comm import costmodel

AWS = load_catalog("aws")
JOB = Job(REFERENCE_PARAMS, 10**10)
TRAFFIC = planner.model_traffic("124m")


def cand(name: str, nodes: int = 8, tier: str = "25g", machine=None) -> planner.Candidate:
    return planner.Candidate("aws", machine or AWS.types[name], tier, nodes)


# -- the figures ----------------------------------------------------------------------------------

def test_the_brief_s_gpus_have_sourced_figures_and_the_cli_offers_every_one():
    assert set(_ACCELERATORS) == set(ACCELERATORS)
    assert {"t4", "a10g", "l4", "l40s", "a100", "h100", "rtx4090"} <= set(ACCELERATORS)
    for kind, accel in ACCELERATORS.items():
        assert accel.kind == kind and accel.tokens_per_s > 0
        assert accel.source.startswith(("measured:", "derived, not measured:", "docs/BENCHMARKS.md"))
        if accel.source.startswith("derived"):  # every number the derivation used is in the string
            sheet = DATASHEETS[kind]
            assert f"{sheet.tflops:g}/" in accel.source and f"{sheet.memory_gbs:g}/" in accel.source
    # The derivations as the docs' table gives them.
    assert ACCELERATORS["t4"].tokens_per_s == pytest.approx(35_032, abs=1)
    assert ACCELERATORS["a10g"].tokens_per_s == pytest.approx(46_758, abs=1)
    assert ACCELERATORS["l4"].tokens_per_s == pytest.approx(32_842, abs=1)
    assert ACCELERATORS["l40s"].tokens_per_s == pytest.approx(94_586, abs=1)
    assert ACCELERATORS["a100-80gb"].tokens_per_s == pytest.approx(218_453, abs=1)


def test_the_derivation_rule_holds_the_measured_gpus_between_its_bounds():
    # A step scales between the TFLOPS ratio and the memory bandwidth ratio: the A100 and H100
    # that llm.c measured lie between the bounds derived from the RTX 4090's measured figure.
    for kind in ("a100-80gb", "h100"):
        low = derive(kind, kind, RTX4090).tokens_per_s
        sheet, ref = DATASHEETS[kind], DATASHEETS["rtx4090"]
        high = RTX4090.tokens_per_s * max(sheet.tflops / ref.tflops, sheet.memory_gbs / ref.memory_gbs)
        assert low <= ACCELERATORS[kind].tokens_per_s <= high, kind


def test_gpu_kinds_from_what_the_providers_call_them():
    assert [gpu_kind(n) for n in ("T4", "A10G", "L4", "L40S", "H100", "V100", "T4g")] == \
        ["t4", "a10g", "l4", "l40s", "h100", "v100", "t4g"]
    assert gpu_kind("A100", 40.0) == "a100" and gpu_kind("A100", 80.0) == "a100-80gb"
    assert gpu_kind("nvidia_h100") == "h100" and gpu_kind("amd_mi300x") == "mi300x"
    assert gpu_kind("NVIDIA GeForce RTX 4090") == "rtx4090"


def test_the_shipped_catalog_names_each_gpu_type_s_gpu():
    kinds = {name.split(".")[0]: t.gpu_kind for name, t in AWS.types.items() if t.gpus}
    assert kinds == {"g4dn": "t4", "g5": "a10g", "g6": "l4", "p4d": "a100", "p5": "h100"}
    assert all(t.gpu_kind is None for t in AWS.types.values() if not t.gpus)


# -- each machine at its own GPUs -----------------------------------------------------------------

def test_a_g4dn_12xlarge_is_planned_at_4_t4_not_4_rtx_4090():
    p = planner.predict(JOB, None, TRAFFIC, cand("g4dn.12xlarge"))
    t4 = ACCELERATORS["t4"]
    assert p.accel is t4 and p.per_node == 4 and p.ranks_per_node == 4
    assert p.compute_s == pytest.approx(JOB.tokens_per_step / 8 / (4 * t4.tokens_per_s))
    as_4090 = planner.predict(JOB, ACCELERATORS["rtx4090"], TRAFFIC, cand("g4dn.12xlarge"))
    assert p.compute_s == pytest.approx(as_4090.compute_s * RTX4090.tokens_per_s / t4.tokens_per_s)
    assert p.to_dict()["accelerator"] == "t4" and p.to_dict()["per_node"] == 4


def test_each_type_gets_its_own_gpu_in_one_ranking(run_cli):
    doc = json.loads(run_cli("plan", "--json", "--catalog", "aws", "--nodes", "4", "--top", "100").output)
    assert doc["accelerator"] is None
    by_family = {}
    for p in doc["plans"]:
        by_family.setdefault(p["machine"].split(".")[0], set()).add(p["accelerator"])
    assert by_family == {"g4dn": {"t4"}, "g5": {"a10g"}, "g6": {"l4"}}
    assert set(doc["accelerators"]) == {"t4", "a10g", "l4"}
    assert doc["accelerators"]["t4"]["source"] == ACCELERATORS["t4"].source
    big = next(p for p in doc["plans"] if p["machine"] == "g5.48xlarge")
    assert (big["per_node"], big["ranks_per_node"]) == (8, 8)


def test_accelerator_forces_one_for_every_type(run_cli):
    p = planner.predict(JOB, ACCELERATORS["h100"], TRAFFIC, cand("g4dn.12xlarge"))
    assert p.accel.kind == "h100" and p.per_node == 4
    doc = json.loads(run_cli("plan", "--json", "--catalog", "aws", "--nodes", "4", "--top", "100",
                             "--accelerator", "h100").output)
    assert doc["accelerator"]["name"] == "H100" and {p["accelerator"] for p in doc["plans"]} == {"h100"}
    # --tokens-per-s alone: the user's figure for every GPU of every type.
    doc = json.loads(run_cli("plan", "--json", "--catalog", "aws", "--nodes", "4", "--top", "100",
                             "--tokens-per-s", "50000").output)
    assert {p["accelerator"] for p in doc["plans"]} == {"given"}
    assert doc["accelerator"]["tokens_per_s"] == 50000.0
    # The CPU case still plans the types without a GPU, per vCPU.
    doc = json.loads(run_cli("plan", "--json", "--catalog", "aws", "--nodes", "4", "--tier", "10g",
                             "--accelerator", "cpu").output)
    assert all(p["accelerator"] == "cpu" and p["ranks_per_node"] == 1 for p in doc["plans"])


# -- a GPU without a sourced figure ---------------------------------------------------------------

def write_catalog(root, types: dict, hourly: dict) -> None:
    """A refreshed AWS catalog for every region in the project at `root`."""
    path = catalog.refreshed_path(root, "aws", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provider": "aws", "date": "2026-12-01", "region": None,
                                "source": "test", "prices": {"date": "2026-12", "hourly": hourly},
                                "types": types}))
    catalog.clear_cache()


def gpu_type(gpus: int, **kw) -> dict:
    return {"baseline_gbps": 100.0, "peak_gbps": 100.0, "vcpus": 96, "memory_gib": 768.0,
            "gpus": gpus, "arch": "x86_64", "cluster_placement": True, **kw}


def test_a_type_with_an_unsourced_gpu_is_marked_and_not_ranked(project_dir, run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    write_catalog(project_dir, {
        "p3dn.24xlarge": gpu_type(8, gpu_kind="v100", gpu_name="NVIDIA V100"),
        "g4dn.12xlarge": gpu_type(4, gpu_kind="t4", gpu_name="NVIDIA T4"),
    }, {"p3dn.24xlarge": 31.212, "g4dn.12xlarge": 3.912})
    cands = planner.candidates(None, range(4, 5), ("aws",), root=project_dir)
    assert {c.machine.name for c in cands} == {"p3dn.24xlarge", "g4dn.12xlarge"}
    ranked = planner.plan(JOB, None, TRAFFIC, cands)
    assert [p.candidate.machine.name for p in ranked] == ["g4dn.12xlarge"]
    [left] = planner.unranked(cands)
    assert left.machine.name == "p3dn.24xlarge" and left.reason == "no sourced figure for NVIDIA V100 (v100)"
    with pytest.raises(ConfigError, match="no sourced figure for NVIDIA V100"):
        planner.predict(JOB, None, TRAFFIC, next(c for c in cands if c.machine.gpu_kind == "v100"))
    doc = json.loads(run_cli("plan", "--json", "--catalog", "aws", "--nodes", "4").output)
    assert [p["machine"] for p in doc["plans"]] == ["g4dn.12xlarge"]
    assert doc["unranked"] == [{"provider": "aws", "machine": "p3dn.24xlarge", "gpus": 8,
                                "gpu_kind": "v100", "reason": "no sourced figure for NVIDIA V100 (v100)"}]
    table = run_cli("plan", "--catalog", "aws", "--nodes", "4").output
    assert "not ranked: no sourced figure for NVIDIA V100 (v100): p3dn.24xlarge; give --accelerator" in table
    # Forced, it is planned like any other type.
    doc = json.loads(run_cli("plan", "--json", "--catalog", "aws", "--nodes", "4", "--accelerator", "a100").output)
    assert {p["machine"] for p in doc["plans"]} == {"p3dn.24xlarge", "g4dn.12xlarge"} and not doc["unranked"]
    # Nothing with a figure at all: one line saying why.
    write_catalog(project_dir, {"p3dn.24xlarge": gpu_type(8, gpu_kind="v100", gpu_name="NVIDIA V100")},
                  {"p3dn.24xlarge": 31.212})
    result = run_cli("plan", "--catalog", "aws", "--nodes", "4")
    assert result.exit_code == 2 and "no machine type has a sourced figure" in result.output
    catalog.clear_cache()


def test_a_share_of_one_gpu_is_no_whole_gpu():
    share = catalog.MachineType("g6f.large", 1.0, 10.0, 2, 8.0, gpus=0, gpu_kind="l4", gpu_name="NVIDIA L4")
    assert node_accelerator(share) is None and missing_figure(share) == "a share of one NVIDIA L4, not a whole GPU"
    plain = catalog.MachineType("c5.large", 0.75, 10.0, 2, 4.0)
    assert node_accelerator(plain) is ACCELERATORS["cpu"]


def test_a_catalog_from_before_kinds_were_recorded_still_loads_and_says_so(project_dir, run_cli):
    old = {"g5.12xlarge": gpu_type(4), "c5n.9xlarge": {"baseline_gbps": 50.0, "peak_gbps": 50.0,
                                                        "vcpus": 36, "memory_gib": 96.0, "gpus": 0}}
    write_catalog(project_dir, old, {"g5.12xlarge": 5.672, "c5n.9xlarge": 1.944})
    found = load_catalog("aws", None, project_dir)
    assert found.types["g5.12xlarge"].gpu_kind is None and found.types["g5.12xlarge"].gpus == 4
    doc = json.loads(run_cli("plan", "--json", "--catalog", "aws", "--nodes", "4", "--accelerator", "a10g").output)
    assert [p["machine"] for p in doc["plans"]] == ["g5.12xlarge"]
    result = run_cli("plan", "--catalog", "aws", "--nodes", "4")
    assert result.exit_code == 2 and "does not say which GPU" in result.output
    assert "--accelerator" in result.output
    doc = json.loads(run_cli("plan", "--json", "--catalog", "aws", "--nodes", "4", "--accelerator", "cpu").output)
    assert [p["machine"] for p in doc["plans"]] == ["c5n.9xlarge"]
    catalog.clear_cache()


# -- several GPUs in a node -----------------------------------------------------------------------

def test_a_multi_gpu_node_sums_inside_and_the_link_carries_the_ring_across_nodes(monkeypatch):
    seen = []
    real = costmodel.choose_comm

    def spy(link, compute_s, grad_accum, traffic, world_size, **kwargs):
        seen.append(world_size)
        return real(link, compute_s, grad_accum, traffic, world_size, **kwargs)

    monkeypatch.setattr(planner, "choose_comm", spy)
    eight = planner.predict(JOB, None, TRAFFIC, cand("g5.48xlarge", nodes=2))  # 8 A10G a node
    one = planner.predict(JOB, None, TRAFFIC, cand("g5.16xlarge", nodes=2))  # 1 A10G a node
    # 2 nodes of 8 ranks: the link carries a ring of 2 nodes (the gradient once), not of 16 ranks.
    assert seen == [2, 2] and eight.ranks_per_node == 8
    grad = 4 * TRAFFIC.params
    assert eight.ring_bytes == ring_allreduce_bytes(grad, 2) == grad
    assert eight.ring_bytes < 2 * 15 / 16 * grad
    assert eight.compute_s == pytest.approx(one.compute_s / 8)
    # The ring's time is the gradient over the link, whatever the node's GPU count.
    plain = eight.link.gbps * 1e9 / 8
    none = real(costmodel.LinkEstimate(eight.link.gbps, 2 * planner.HOP_LATENCY_S, "x"),
                eight.compute_s, 1, costmodel.GradTraffic(grad, 1, TRAFFIC.powersgd_bytes), 2)
    assert none.predicted["none"]["comm_s"] == pytest.approx(2 * planner.HOP_LATENCY_S + grad / plain, rel=1e-6)


def test_the_in_node_path_is_faster_than_every_shipped_gpu_type_s_link():
    for machine in AWS.types.values():
        if machine.gpus and machine.baseline_gbps:
            link = plan_link("aws", machine, node_accelerator(machine), "25g", 25)
            assert link.gbps <= IN_NODE_GBPS, machine.name
