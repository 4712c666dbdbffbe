"""comm=auto's re-decision in a user's script: when every rank asks, and that all ranks agree.

The agreement runs on a real 2-rank gloo group (two processes over loopback), where each rank
sees different step times: only rank 0's verdict counts, every rank re-probes in the same call,
and the steps between checks issue no collective.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from fatpipe.trainer.comm.decision import CommDecision, LinkEstimate, SwitchRefused
from fatpipe.trainer.comm.redecide import (
    CHECK_SHARE,
    MAX_CHECK_EVERY,
    WINDOW,
    AutoComm,
    check_every,
)
from fatpipe.trainer.config import TrainConfig


def _decision(step_s: float = 0.5, latency_s: float = 1e-4, comm: str = "none",
              **fields) -> CommDecision:
    return CommDecision(comm, "test", LinkEstimate(1.0, latency_s, "test"),
                        predicted={comm: {"step_s": step_s}}, **fields)


def test_checks_are_at_least_a_window_apart_and_cost_a_small_share():
    assert check_every(_decision(0.5, 1e-4)) == WINDOW  # a LAN: a window is the floor
    # 50 ms round trips and 0.1 s steps: one check per 100 steps would be 0.5%, capped at 50.
    assert check_every(_decision(0.1, 0.05)) == MAX_CHECK_EVERY
    every = check_every(_decision(0.2, 0.02))  # 20 ms round trips, 0.2 s steps: every 20
    assert every == 20 and 0.02 / (every * 0.2) <= CHECK_SHARE
    assert check_every(CommDecision("none", "test")) == MAX_CHECK_EVERY  # nothing predicted: rarely


def _auto(steps: int = 100, redecide: bool = True, **decision) -> AutoComm:
    cfg = TrainConfig(comm="auto", steps=steps, warmup_steps=3, redecide=redecide)
    env = SimpleNamespace(world_size=2, is_main=True, device=torch.device("cpu"))
    return AutoComm(cfg, env, _decision(**decision), 0)


def _asked(auto: AutoComm, steps, step_s: float) -> list[int]:
    """The steps at which `at_step` asked for rank 0's verdict (the collective)."""
    asked = []
    auto.agreed_off = lambda: asked.append(step) or False
    for step in steps:
        auto.observe({"step": step, "step_s": step_s})
        auto.at_step(step, None, lambda new: None, lambda name: None)
    return asked


def test_a_script_asks_only_every_check_every_steps_and_not_after_the_last():
    auto = _auto(steps=23)
    assert _asked(auto, range(1, 24), 0.5) == [5, 10, 15, 20]
    assert _asked(_auto(redecide=False), range(1, 30), 0.5) == []
    assert _asked(_auto(comm="localsgd"), range(1, 30), 0.5) == []  # periodic: never switched


# Two processes on one gloo group; rank 0's steps are slow, rank 1's on time. The re-probe is
# replaced by a recorder: which steps each rank re-probed at, and the collectives it issued.
AGREE = """
import json, os, sys, torch, torch.distributed as dist
from fatpipe.trainer.comm.decision import CommDecision, LinkEstimate
from fatpipe.trainer.comm.redecide import AutoComm
from fatpipe.trainer.config import TrainConfig
from fatpipe.trainer.distenv import DistEnv
from fatpipe.trainer.faults import ISSUED
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
env = DistEnv(rank=rank, local_rank=0, world_size=2, restarts=0, device=torch.device("cpu"),
              backend="gloo")
decision = CommDecision("bf16", "t", LinkEstimate(1.0, 1e-4, "test"),
                        predicted={"bf16": {"step_s": 0.5}})
auto = AutoComm(TrainConfig(comm="auto", steps=40, warmup_steps=3), env, decision, 0)
reprobed, issued = [], []
auto.reprobe = lambda model, step, apply, refuse: reprobed.append(step) or auto.decision
for step in range(1, 31):
    auto.observe({"step": step, "step_s": 2.0 if rank == 0 else 0.5})
    before = ISSUED.count
    auto.at_step(step, None, lambda new: None, lambda name: None)
    if ISSUED.count > before:
        issued.append(step)
print(json.dumps({"reprobed": reprobed, "issued": issued, "every": auto.every}))
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.timeout(300)
def test_every_rank_reprobes_at_the_step_rank_0_saw_off(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([sys.executable, "-c", AGREE, str(rank), str(tmp_path / "store")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in (0, 1)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.splitlines()[-1]))
    first, second = results
    assert first["every"] == second["every"] == WINDOW
    # Warm-up (WARM_STEPS) and a full window first: the verdict is in by step 7, asked at 10.
    assert first["reprobed"] == second["reprobed"] and first["reprobed"][0] == 10
    assert first["issued"] == second["issued"] == [5, 10, 15, 20, 25, 30]


def _reprobed(monkeypatch, refuse) -> tuple[AutoComm, CommDecision, list[CommDecision]]:
    """A re-probe at step 20 after which PowerSGD wins by far; the decisions `apply` got."""
    import fatpipe.trainer.comm.redecide as redecide

    def redecided(cfg, env, model, current, step):
        return CommDecision("powersgd", "fastest", LinkEstimate(0.02, 1e-3, "probe"),
                            predicted={"none": {"step_s": 1.2, "run_step_s": 1.2, "share": 0.8},
                                       "powersgd": {"step_s": 0.3, "run_step_s": 0.3,
                                                    "share": 0.1}})

    monkeypatch.setattr(redecide, "redecide_comm", redecided)
    auto = _auto()
    for step in range(1, 21):
        auto.observe({"step": step, "step_s": 1.2})
    applied: list[CommDecision] = []
    return auto, auto.reprobe(None, 20, applied.append, refuse), applied


def test_a_switch_the_script_cannot_take_is_refused_with_the_reason(monkeypatch):
    auto, kept, applied = _reprobed(monkeypatch, lambda name: "one DDP bucket needed")
    assert applied == [] and kept.comm == "none" and kept.switches == ()
    assert kept.switch_refused == SwitchRefused(20, "powersgd", "one DDP bucket needed")
    assert kept.reprobes == 1 and auto.reference == pytest.approx(1.2)  # no re-probe loop
    assert auto.decision is kept


def test_a_switch_the_script_can_take_is_applied_and_recorded(monkeypatch):
    auto, new, applied = _reprobed(monkeypatch, lambda name: None)
    # The hook applied is the one returned; the switch is recorded once it is done.
    assert [(d.comm, d.since_step) for d in applied] == [(new.comm, new.since_step)]
    assert new.comm == "powersgd" and new.since_step == 20
    (switch,) = new.switches
    assert (switch.from_comm, switch.to, switch.step) == ("none", "powersgd", 20)
    assert switch.pause_s >= switch.probe_s >= 0
    assert auto.decision is new and auto.predicted == 0.3
    assert auto.summary([])["comm_switches"] == 1


def test_a_named_hooks_decision_without_link_or_prediction_checks_at_the_longest_interval():
    # decide_comm's answer for comm=none etc.: no link and nothing predicted.
    from fatpipe.trainer.comm.decision import read_decision
    from fatpipe.trainer.comm.redecide import MAX_CHECK_EVERY, check_every

    named = read_decision({"comm": "none", "reason": "set by --comm", "link": None,
                           "predicted": None})
    assert check_every(named) == MAX_CHECK_EVERY
