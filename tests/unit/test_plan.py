"""`fatpipe plan`'s step model: ring all-reduce bytes, per-flow caps, burst-only marks, ranking,
and the method from the trainer's own comm=auto model (real catalogs, real choose_comm)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fatpipe.infra.catalog import MachineType, load_catalog
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.jobmodel import (
    ACCELERATORS,
    REFERENCE_PARAMS,
    Job,
    accelerator,
    flows_per_peer,
    plan_link,
    ring_allreduce_bytes,
)
from fatpipe.ops.plan import plan as planner
from fatpipe.trainer.comm import costmodel
from fatpipe.trainer.config import PRESETS
from fatpipe.trainer.gptconfig import parameter_shapes, preset_config

AWS = load_catalog("aws")
DO = load_catalog("digitalocean")
GPU = ACCELERATORS["rtx4090"]
CPU = ACCELERATORS["cpu"]


def machine(name="x", baseline=10.0, peak=10.0, price=1.0, vcpus=8, gpus=1, placement=True):
    return MachineType(name, baseline, peak, vcpus, 32.0, gpus, cluster_placement=placement,
                       price_hourly=price)


def test_ring_allreduce_sends_two_n_minus_one_over_n_of_the_gradient():
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 8) == 1750
    assert ring_allreduce_bytes(1000, 1) == 0


def test_aws_caps_one_flow_at_10_gbit_in_a_placement_group_and_5_outside():
    big = AWS.types["c6in.8xlarge"]  # 50 Gbit/s baseline
    link = plan_link("aws", big, CPU, "25g", 25)  # gloo: one flow per peer
    assert (link.gbps, link.flow_cap_gbps, link.tier_unreachable) == (10.0, 10.0, True)
    t3 = AWS.types["t3.2xlarge"]  # may not join a cluster placement group
    assert plan_link("aws", t3, CPU, "1g", 1).flow_cap_gbps == 5.0
    # NCCL on an AWS GPU node opens 2 threads x 8 sockets per peer (ENA): 16 flows of 10.
    gpu_link = plan_link("aws", AWS.types["g4dn.8xlarge"], GPU, "10g", 10)
    assert (gpu_link.gbps, gpu_link.flow_cap_gbps, gpu_link.tier_unreachable) == (50.0, 160.0, False)
    assert flows_per_peer(GPU, "10g") == 8  # elsewhere the tier's: 2 threads x 4 sockets at 10g


def test_digitalocean_publishes_no_flow_cap_so_the_baseline_is_the_link():
    link = plan_link("digitalocean", DO.types["s-4vcpu-8gb-amd"], CPU, "10g", 10)
    assert (link.gbps, link.flow_cap_gbps, link.tier_unreachable) == (10.0, None, False)


def test_burst_only_marks_a_baseline_under_half_the_advertised_rate():
    assert plan_link("aws", AWS.types["t3.large"], CPU, "1g", 1).burst_only  # 0.512 of 5
    assert not plan_link("aws", AWS.types["c5n.18xlarge"], CPU, "25g", 25).burst_only
    # The link is the baseline, never the burst.
    assert plan_link("aws", AWS.types["m7i.large"], CPU, "1g", 1).gbps == pytest.approx(0.781)


def test_compute_scales_inversely_with_parameters_and_splits_the_batch():
    small, big = Job(REFERENCE_PARAMS // 2, 10**9), Job(REFERENCE_PARAMS, 10**9)
    assert small.compute_s(GPU, 8) == pytest.approx(big.compute_s(GPU, 8) / 2)
    assert big.compute_s(GPU, 4) == pytest.approx(2 * big.compute_s(GPU, 8))
    # The seed table's figure: 131,072 tokens per node at 110,350 tokens/s is 1,187.8 ms.
    assert big.compute_s(GPU, 4) == pytest.approx(1.1878, abs=1e-3)
    # A CPU node computes per vCPU.
    assert big.compute_s(CPU, 2, machine(vcpus=16)) == pytest.approx(big.compute_s(CPU, 2, machine(vcpus=8)) / 2)


def test_bad_job_input_is_one_clear_error():
    with pytest.raises(ConfigError, match="params"):
        Job(0, 10)
    with pytest.raises(ConfigError, match="unknown accelerator 'tpu'"):
        accelerator("tpu")
    with pytest.raises(ConfigError, match="tokens-per-s"):
        accelerator("h100", -5)
    with pytest.raises(ConfigError, match="not a count"):
        planner.model_traffic("huge")
    assert accelerator("h100", 1e6).tokens_per_s == 1e6


def test_model_sizes_come_from_the_trainers_presets_or_a_count():
    gpt2 = planner.model_traffic("124m")
    assert 124e6 < gpt2.params < 125e6
    assert gpt2.powersgd_bytes < 0.02 * 4 * gpt2.params  # rank 4 sends ~1% of GPT-2's gradient
    assert planner.model_traffic("1.5B").params == 1_500_000_000


def test_a_presets_traffic_is_the_gpts_own_counted_without_torch():
    """The plan counts a preset's parameters from `gptconfig.parameter_shapes`: the shapes the
    trainer's GPT builds, in its order (so PowerSGD's bytes are the run's too)."""
    import torch

    from fatpipe.trainer.model import GPT

    for preset in PRESETS:
        cfg = preset_config(preset, block_size=1024)
        with torch.device("meta"):
            model = GPT(cfg)
        assert parameter_shapes(cfg) == [tuple(p.shape) for p in model.parameters()]
        assert planner.model_traffic(preset).params == model.num_params()


def test_fatpipe_plan_runs_without_torch(tmp_path):
    """`fatpipe plan` acts on no cluster: the trainer's comm model it prices with is torch-free
    (`trainer.comm.costmodel`), so the command neither imports nor needs torch, across regions
    included (a fresh interpreter: this one has torch loaded already; in a folder without
    fatpipe.toml, so on the embedded cluster file)."""
    code = ("import json, sys\n"
            "import fatpipe.cli.plan, fatpipe.ops.plan.plan, fatpipe.ops.plan.regionplan\n"
            "from fatpipe.cli.main import cli\n"
            "for span in ('region', 'regions'):\n"
            "    cli(['plan', '--nodes', '2-3', '--span', span, '--auto-periodic', '--json'],\n"
            "        standalone_mode=False)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')),\n"
            "      file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.splitlines()[-1]) == []
    assert '"method"' in done.stdout


def seed_candidate(gbps: float) -> planner.Candidate:
    return planner.Candidate("digitalocean", machine(f"{gbps:g}g", gbps, gbps, gpus=1), "1g", 8)


def test_the_seeds_job_on_1_and_10_gbit_links_uses_comm_autos_own_choice(monkeypatch):
    job, traffic = Job(REFERENCE_PARAMS, 10**10), planner.model_traffic("124m")
    slow = planner.predict(job, GPU, traffic, seed_candidate(1))
    fast = planner.predict(job, GPU, traffic, seed_candidate(10))
    # Plain DDP at 1 Gbit/s: 1.75 x 498 MB over the link takes ~7 s against ~0.6 s of compute.
    assert slow.plain_step_s > 10 * slow.compute_s
    assert fast.plain_step_s < 2 * fast.compute_s
    assert slow.method != "none" and slow.step_s < slow.plain_step_s / 5
    # The method is whatever the trainer's choose_comm says for that link.
    seen = []
    real = costmodel.choose_comm

    def spy(link, *args, **kwargs):
        decision = real(link, *args, **kwargs)
        seen.append((link.busbw_gbps, decision.comm))
        return decision

    monkeypatch.setattr(planner, "choose_comm", spy)
    again = planner.predict(job, GPU, traffic, seed_candidate(1))
    assert seen == [(1.0, again.method)] and again.method == slow.method
    assert slow.hours == pytest.approx(job.steps * slow.step_s / 3600)
    assert slow.dollars == pytest.approx(slow.hours * 8 * 1.0)


def test_ranking_by_time_or_by_cost():
    job, traffic = Job(REFERENCE_PARAMS, 10**9), planner.model_traffic("124m")
    fast_dear = planner.Candidate("aws", machine("dear", 100, 100, price=50.0), "25g", 8)
    slow_cheap = planner.Candidate("aws", machine("cheap", 0.5, 5, price=0.5), "1g", 2)
    by_time = planner.plan(job, GPU, traffic, [slow_cheap, fast_dear], by="time")
    by_cost = planner.plan(job, GPU, traffic, [fast_dear, slow_cheap], by="cost")
    assert [p.candidate.machine.name for p in by_time] == ["dear", "cheap"]
    assert [p.candidate.machine.name for p in by_cost] == ["cheap", "dear"]
    assert by_time[1].link.burst_only
    with pytest.raises(ConfigError, match="--by"):
        planner.rank(by_time, "speed")


def test_candidates_sit_at_the_highest_tier_their_baseline_reaches():
    found = planner.candidates(CPU, range(2, 4), providers=("aws", "digitalocean"))
    assert {c.nodes for c in found} == {2, 3}
    gbps = {"1g": 1, "10g": 10, "25g": 25}
    for c in found:
        assert c.machine.baseline_gbps >= gbps[c.tier] and c.machine.gpus == 0
        higher = [t for t, g in gbps.items() if g > gbps[c.tier]]
        assert all(c.machine.baseline_gbps < gbps[t] for t in higher)
    aws = [c for c in found if c.provider == "aws"]
    assert aws[0].extras_hourly == pytest.approx(0.005 + 0.00288)  # public IPv4 + monitoring
    with pytest.raises(ConfigError, match="2 nodes"):
        planner.predict(Job(REFERENCE_PARAMS, 10**9), CPU, planner.model_traffic("tiny"),
                        planner.Candidate("aws", machine(), "1g", 1))
