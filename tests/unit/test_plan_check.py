"""bench/plan_check.py's comparison (from its recorded runs, no sim needed) and the job's own
PowerSGD warm-up in `fatpipe plan`'s prediction."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from fatpipe.infra.catalog import MachineType
from fatpipe.infra.jobmodel import ACCELERATORS, Job
from fatpipe.ops.plan import plan as planner

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def plan_check():
    spec = importlib.util.spec_from_file_location("plan_check", BENCH / "plan_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_job_pays_its_own_powersgd_warm_up_not_the_trainers_default():
    traffic = planner.model_traffic("124m")
    link = MachineType("1 Gbit/s", 1.0, 1.0, 0, 0.0, gpus=1)
    cand = planner.Candidate("link", link, "1g", 8)
    short = [planner.predict(Job(traffic.params, 30 * 524_288, 524_288, warmup), ACCELERATORS["rtx4090"],
                             traffic, cand) for warmup in (2, None)]
    assert short[0].method == short[1].method == "powersgd"
    # 2 plain steps of 30 against the trainer's 20: each plain step costs the whole ring.
    assert short[0].step_s < 0.5 * short[1].step_s


def test_the_recorded_runs_compare_within_the_goal_on_the_compute_they_spent(plan_check):
    doc = json.loads((BENCH / "results" / "plan_check.json").read_text())
    args = argparse.Namespace(**doc["args"])
    rows = [plan_check.compare(args, row) for row in doc["rows"]]
    assert [(r["nodes"], r["tier"]) for r in rows] == [(2, "10g"), (3, "10g"), (4, "1g")]
    assert all(abs(r["step_error"]) <= plan_check.GOAL for r in rows)
    assert all(abs(r["predicted_on_probe"]["step_error"]) <= plan_check.GOAL for r in rows)
    assert "| 4 | 1g" in plan_check.table(rows)


def test_measure_counts_every_step_and_the_share_after_the_plain_ones(plan_check):
    records = [{"step_s": 1.0, "exposed_comm_s": 0.8}] * 2 + [{"step_s": 0.5, "exposed_comm_s": 0.1}] * 8
    m = plan_check.measure(records, plain_steps=2)
    assert m["step_s"] == pytest.approx(0.6) and m["share"] == pytest.approx(0.2)
    assert m["compute_s"] == pytest.approx((6.0 - 2.4) / 10)
