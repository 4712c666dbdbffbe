"""Local SGD and DiLoCo without processes: the interval comm=auto picks, the outer step, the
schedule, checkpoint state; the sim's link_gbps key."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from pydantic import ValidationError

from fatpipe.infra.clusters import SimCluster
from fatpipe.infra.trainspec import TrainSpec
from fatpipe.trainer.comm.costmodel import MAX_SYNC_EVERY, MIN_AUTO_SYNC_EVERY, predict_periodic
from fatpipe.trainer.comm.decision import CommDecision, LinkEstimate
from fatpipe.trainer.comm.periodic import (
    OUTER_LR,
    OUTER_MOMENTUM,
    DiLoCo,
    LocalSGD,
    sync_interval,
)
from fatpipe.trainer.config import ConfigError, TrainConfig, parse_config

pytestmark = pytest.mark.timeout(60)


def test_auto_picks_the_smallest_interval_within_the_budget():
    # 10 MB over a 0.1 Gbit/s ring of 4 (bus factor 1.5): 1.2 s per sync; compute 50 ms.
    link = LinkEstimate(busbw_gbps=0.1, latency_s=0.0, source="probe")
    p = predict_periodic(link, compute_s=0.05, param_bytes=10_000_000, world_size=4, budget=0.2)
    assert set(p) == {"diloco", "localsgd"}
    d = p["diloco"]
    assert d["sync_s"] == pytest.approx(1.2)
    h = d["sync_every"]
    share = lambda h: (1.2 / h) / (0.05 + 1.2 / h)  # noqa: E731
    assert share(h) <= 0.2 + 1e-12 < share(h - 1)  # the smallest that fits
    assert h == 96
    assert d["wire_bytes"] == 10_000_000 // h and d["exposed_s"] == pytest.approx(1.2 / h)
    assert d["step_s"] == pytest.approx(0.05 + 1.2 / h) and d["share"] == pytest.approx(share(h))


def test_interval_is_at_least_two_and_capped():
    fast = LinkEstimate(100.0, 0.0, "probe")
    assert predict_periodic(fast, 1.0, 1000, 2, 0.2)["diloco"]["sync_every"] == 2
    slow = LinkEstimate(1e-6, 0.0, "probe")
    capped = predict_periodic(slow, 0.01, 10_000_000, 4, 0.2)["localsgd"]
    assert capped["sync_every"] == MAX_SYNC_EVERY and capped["share"] > 0.2


def test_auto_weighs_the_periodic_methods_after_the_hooks():
    from fatpipe.trainer.comm.costmodel import GradTraffic, HookCost, choose_comm
    from fatpipe.trainer.config import HOOK_NAMES, PERIODIC_NAMES

    traffic = GradTraffic(10_000_000, buckets=1, powersgd_bytes=2_000_000, powersgd_buckets=1)
    slow = LinkEstimate(busbw_gbps=0.01, latency_s=1e-4, source="probe")
    everything = HOOK_NAMES + PERIODIC_NAMES
    long_run = choose_comm(slow, 0.05, 1, traffic, 4, hooks=everything,
                           cost=HookCost(steps_left=10_000), auto_periodic=True)
    assert long_run.comm == "diloco"  # fastest by far; DiLoCo ranks before plain averaging
    d = long_run.predicted["diloco"]
    assert d["usable"] and d["sync_every"] == MAX_SYNC_EVERY < d["sync_every_needed"]
    assert long_run.predicted["localsgd"]["sync_every"] == MAX_SYNC_EVERY
    # A faster link: the budget needs H = 10, auto syncs no more often than every 50 steps.
    fair = LinkEstimate(busbw_gbps=1.0, latency_s=1e-4, source="probe")
    fits = choose_comm(fair, 0.05, 1, traffic, 4, hooks=everything,
                       cost=HookCost(steps_left=10_000), auto_periodic=True)
    h = fits.predicted["diloco"]["sync_every"]
    assert fits.comm == "diloco" and fits.predicted["diloco"]["share"] <= 0.2
    assert h == MIN_AUTO_SYNC_EVERY and fits.predicted["diloco"]["sync_every_needed"] == 10
    assert "the budget needs 10" in fits.reason
    # A run too short for two syncs at that interval: logged, but never picked.
    short = choose_comm(fair, 0.05, 1, traffic, 4, hooks=everything,
                        cost=HookCost(steps_left=2 * h - 2), auto_periodic=True)
    assert short.comm in HOOK_NAMES and not short.predicted["diloco"]["usable"]
    assert "needs two intervals" in short.reason
    # Callers that name hooks only get hooks only.
    assert set(choose_comm(slow, 0.05, 1, traffic, 4).predicted) == set(HOOK_NAMES)


def test_the_interval_comes_from_auto_or_the_flag():
    auto = CommDecision("diloco", "test", predicted={"diloco": {"sync_every": 37}})
    assert sync_interval(auto, 16) == 37
    assert sync_interval(CommDecision("diloco", "set by --comm"), 16) == 16


def test_config_and_train_table_know_the_periodic_comms():
    cfg = parse_config(["--comm", "diloco", "--sync-every", "8"])
    assert (cfg.comm, cfg.sync_every) == ("diloco", 8)
    with pytest.raises(ConfigError, match="--sync-every"):
        TrainConfig(sync_every=0)
    args = TrainSpec(comm="localsgd", sync_every=4).trainer_args()
    assert args[args.index("--comm") + 1] == "localsgd"
    assert args[args.index("--sync-every") + 1] == "4"
    with pytest.raises(ValidationError):
        TrainSpec(sync_every=0)


@pytest.fixture
def group():
    """A one-rank gloo group: the collectives run for real, with nothing to average."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _local_steps(model, optimizer, n):
    for _ in range(n):  # as the trainer: a sync follows the optimizer step, before zero_grad
        optimizer.zero_grad()
        model(torch.randn(8, 4)).square().mean().backward()
        optimizer.step()


def test_diloco_outer_step_is_nesterov_on_the_pseudo_gradient(group):
    model, opt = _model_and_optimizer()
    start = [p.detach().clone() for p in model.parameters()]
    method = DiLoCo(model, opt, 3, 10, torch.device("cpu"))
    _local_steps(model, opt, 3)
    local = [p.detach().clone() for p in model.parameters()]
    assert not method.due(2) and method.due(3) and method.due(10)
    method.after_step(3)
    comm = method.end_step()
    assert comm.wire_bytes == method.param_bytes == 15 * 4 and comm.exposed_s == comm.sync_s > 0
    # First outer step: momentum buffer = g, Nesterov update g + m * g, g = start - local.
    for p, before, after in zip(model.parameters(), start, local, strict=True):
        g = before - after
        assert torch.allclose(p, before - OUTER_LR * (g + OUTER_MOMENTUM * g), atol=1e-6)
    assert all(torch.equal(p, a) for p, a in zip(model.parameters(), method.anchor, strict=True))
    method.after_step(4)
    assert method.end_step().wire_bytes == 0


def test_diloco_state_round_trips(group):
    model, opt = _model_and_optimizer()
    method = DiLoCo(model, opt, 2, 10, torch.device("cpu"))
    _local_steps(model, opt, 2)
    method.after_step(2)
    _local_steps(model, opt, 1)
    shared, mine = method.shared_state(), method.rank_state()
    other_model, other_opt = _model_and_optimizer()
    again = DiLoCo(other_model, other_opt, 2, 10, torch.device("cpu"), start_step=3)
    again.restore(shared, mine)
    for a, b in zip(model.parameters(), other_model.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(method.anchor, again.anchor, strict=True):
        assert torch.equal(a, b)
    assert again.outer.state_dict()["state"].keys() == method.outer.state_dict()["state"].keys()
    assert torch.equal(again.outer.state_dict()["state"][0]["momentum_buffer"],
                       method.outer.state_dict()["state"][0]["momentum_buffer"])


def test_localsgd_averages_on_the_period_and_at_the_end(group):
    model, opt = _model_and_optimizer()
    method = LocalSGD(model, opt, 4, 10, torch.device("cpu"))
    sent = []
    for step in range(1, 11):
        _local_steps(model, opt, 1)
        method.after_step(step)
        sent.append(method.end_step().wire_bytes)
    assert [s > 0 for s in sent] == [step in (4, 8, 10) for step in range(1, 11)]
    assert method.averager.step == 10  # one count per step: a resume starts from the step
    resumed = LocalSGD(model, opt, 4, 10, torch.device("cpu"), start_step=6)
    assert resumed.averager.step == 6


def test_sim_link_rate_overrides_the_tier_but_not_the_declared_tier():
    from fatpipe.stacks.providers.sim import SIM
    from fatpipe.stacks.providers.sim_stack import node_input

    c = SimCluster(name="sd-a", provider="sim", tier="1g", isolation="netns", link_gbps=0.0125)
    assert c.tier_gbps == 1 and c.link_rate_gbps == 0.0125
    assert node_input(c, 0, "netns")["rate_gbit"] == 0.0125
    assert "link_gbps" in SIM.warnings(c)[0]
    plain = SimCluster(name="sd-b", provider="sim", tier="10g", isolation="netns")
    assert node_input(plain, 1, "netns")["rate_gbit"] == 10 and not SIM.warnings(plain)
    for bad in (0, -1, 1000, math.inf):
        with pytest.raises(ValidationError, match="link_gbps"):
            SimCluster(name="sd-c", provider="sim", link_gbps=bad)
    with pytest.raises(ValidationError, match="loopback"):
        SimCluster(name="sd-d", provider="sim", isolation="loopback", link_gbps=0.5)
