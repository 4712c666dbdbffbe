"""comm=auto's model with measured hook costs, the cost measurement itself, and the re-decision rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from fatpipe.trainer.comm.commsetup import plain_steps
from fatpipe.trainer.comm.costmodel import GradTraffic, HookCost, choose_comm
from fatpipe.trainer.comm.decision import CommDecision, LinkEstimate, Switch
from fatpipe.trainer.comm.redecide import MAX_SWITCHES, THRESHOLD, WARM_STEPS, WINDOW, AutoComm
from fatpipe.trainer.config import TrainConfig

GRAD = 3_300_000  # the tiny preset's gradient
TRAFFIC = GradTraffic(GRAD, buckets=1, powersgd_bytes=150_000, powersgd_buckets=1)
LINK_50M = LinkEstimate(0.05, 2e-3, "test")


def test_the_hooks_own_cost_is_part_of_the_step_and_can_change_the_choice():
    free = choose_comm(LINK_50M, 0.4, 1, TRAFFIC, 4)
    assert free.comm == "powersgd"
    costly = choose_comm(LINK_50M, 0.4, 1, TRAFFIC, 4,
                         cost=HookCost({"powersgd": 0.8, "bf16": 0.01}))
    p = costly.predicted["powersgd"]
    assert p["step_s"] == pytest.approx(p["compute_s"] + p["hook_s"] + p["exposed_s"])
    assert p["hook_s"] == 0.8 and costly.predicted["none"]["hook_s"] == 0.0
    # 0.4 + 0.8 + ~0.02 for PowerSGD against 0.4 + 0.01 + ~0.6 for bf16.
    assert costly.comm in ("bf16", "fp16") and "fastest" in costly.reason
    assert "hook" in costly.describe()
    assert {"compute_s", "hook_s", "comm_s", "exposed_s", "step_s", "run_step_s", "share",
            "wire_bytes"} <= set(p)


def test_powersgds_plain_start_counts_over_a_short_run():
    # 20 of 30 steps before PowerSGD compresses: those steps cost what plain all-reduce costs.
    short = choose_comm(LINK_50M, 0.4, 1, TRAFFIC, 4,
                        cost=HookCost({"powersgd": 0.3}, {"powersgd": 20}, steps_left=30))
    assert short.comm == "bf16"
    p = short.predicted
    assert p["powersgd"]["run_step_s"] == pytest.approx(
        (20 * p["none"]["step_s"] + 10 * p["powersgd"]["step_s"]) / 30)
    long = choose_comm(LINK_50M, 0.4, 1, TRAFFIC, 4,
                       cost=HookCost({"powersgd": 0.3}, {"powersgd": 20}, steps_left=1000))
    assert long.comm == "powersgd"


def test_plain_steps_count_from_when_powersgd_took_over():
    cfg = TrainConfig(warmup_steps=20)
    assert plain_steps(cfg, 0, None) == 20
    assert plain_steps(cfg, 30, None) == 2  # torch's minimum with error feedback
    assert plain_steps(cfg, 15, None) == 5
    on = CommDecision("powersgd", "test", since_step=10)
    assert plain_steps(cfg, 12, on) == 8 and plain_steps(cfg, 40, on) == 0


def _auto(comm: str = "none", predicted_step: float = 0.5, redecide: bool = True, **decision):
    cfg = TrainConfig(comm="auto", steps=100, warmup_steps=3, redecide=redecide)
    env = SimpleNamespace(world_size=4, is_main=True, device=torch.device("cpu"))
    decision = CommDecision(comm, "test", predicted={comm: {"step_s": predicted_step}}, **decision)
    return AutoComm(cfg, env, decision, 0)


def _feed(auto: AutoComm, steps, step_s: float) -> list[dict]:
    return [auto.observe({"step": s, "step_s": step_s}) for s in steps]


def test_the_prediction_is_checked_after_a_warm_up_window():
    auto = _auto()
    recs = _feed(auto, range(1, WARM_STEPS + WINDOW + 1), 0.6)
    assert all(r["predicted_step_s"] == 0.5 for r in recs)
    assert all(r["prediction_error"] is None for r in recs[:-1])
    assert recs[-1]["prediction_error"] == pytest.approx(0.2)
    assert not auto.off()  # 20% is within THRESHOLD
    s = auto.summary(recs)
    assert s["comm_prediction"]["error"] == pytest.approx(0.2)
    assert s["comm_prediction"]["steps_measured"] == WINDOW
    assert s["comm_switches"] == 0


def test_a_step_that_stays_off_triggers_a_reprobe_and_one_outlier_does_not():
    auto = _auto()
    _feed(auto, range(1, 11), 0.5)
    auto.observe({"step": 11, "step_s": 5.0})
    assert not auto.off()  # one slow step: the window's p50 holds
    _feed(auto, range(12, 14), 0.5 * (1 + THRESHOLD) * 1.1)
    assert auto.off()


def test_powersgd_is_measured_only_once_it_compresses():
    auto = _auto("powersgd")
    first = plain_steps(auto.cfg, 0, None) + WARM_STEPS + 1
    recs = _feed(auto, range(1, first + WINDOW), 2.0)
    assert all(r["prediction_error"] is None for r in recs[:first + WINDOW - 2])
    assert recs[-1]["prediction_error"] == pytest.approx(3.0)


def test_switches_are_bounded():
    switch = Switch(5, "none", "bf16", 1.0, 0.5, 1.0, 0.6, 0.1, 1e-3, 0.1, 0.2)
    auto = _auto(switches=(switch,) * MAX_SWITCHES)
    _feed(auto, range(1, 20), 5.0)
    assert not auto.off()


def test_no_checking_without_auto():
    cfg = TrainConfig(comm="bf16")
    env = SimpleNamespace(world_size=4, is_main=True, device=torch.device("cpu"))
    auto = AutoComm(cfg, env, CommDecision("bf16", "set by --comm"), 0)
    assert auto.observe({"step": 1, "step_s": 1.0}) == {"step": 1, "step_s": 1.0}
    assert auto.summary([]) == {}


# In a child process that ends with os._exit, as the trainer does: gloo's threads outlive a
# destroyed process group, and one aborted a loaded test run when it stayed in pytest's process.
HOOK_COSTS = """
import json, os, sys, torch, torch.distributed as dist
from fatpipe.trainer.comm.hookcost import measure_hook_costs
from fatpipe.trainer.model import GPT, preset_config
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = GPT(preset_config("tiny", 64))
state = torch.get_rng_state()
costs = measure_hook_costs(model, ("none", "bf16", "powersgd"), 4, torch.device("cpu"))
print(json.dumps({"costs": costs, "rng_untouched": torch.equal(torch.get_rng_state(), state)}))
sys.stdout.flush()
os._exit(0)
"""


def test_hook_costs_are_measured_with_torchs_hooks():
    done = subprocess.run([sys.executable, "-c", HOOK_COSTS], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    costs = result["costs"]
    assert set(costs) == {"none", "bf16", "powersgd"} and all(c > 0 for c in costs.values())
    assert result["rng_untouched"]  # the trainer's RNG stream is untouched


def test_after_a_reprobe_a_passing_slowdown_does_not_trigger_again():
    auto = _auto()
    auto.reference = 1.0  # re-probed during a slowdown: 1.0 s measured, 0.5 s predicted
    _feed(auto, range(1, 11), 0.5)
    assert not auto.off()  # back to the prediction: nothing changed
    _feed(auto, range(11, 21), 2.0)
    assert auto.off()
    capped = _auto(reprobes=4)
    _feed(capped, range(1, 20), 5.0)
    assert not capped.off()
