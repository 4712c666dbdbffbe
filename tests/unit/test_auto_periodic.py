"""comm=auto and the periodic methods: taken only with [train] auto_periodic, at 50 steps or more,
and otherwise named in the decision with the reason they were not taken."""

from __future__ import annotations

import pytest

from fatpipe.infra.trainspec import TrainSpec
from fatpipe.trainer.comm.costmodel import MIN_AUTO_SYNC_EVERY, GradTraffic, HookCost, choose_comm
from fatpipe.trainer.comm.decision import LinkEstimate
from fatpipe.trainer.config import HOOK_NAMES, PERIODIC_NAMES, parse_config

pytestmark = pytest.mark.timeout(60)

TRAFFIC = GradTraffic(10_000_000, buckets=1, powersgd_bytes=2_000_000, powersgd_buckets=1)
EVERYTHING = HOOK_NAMES + PERIODIC_NAMES
# 10 MB over a 10 Mbit/s ring of 4 with 50 ms of compute: every hook far over budget, and the
# budget alone would have DiLoCo sync every 96 steps.
SLOW = LinkEstimate(busbw_gbps=0.01, latency_s=1e-4, source="test")
# The same at 1 Gbit/s: the budget alone asks for a sync every 10 steps.
FAIR = LinkEstimate(busbw_gbps=1.0, latency_s=1e-4, source="test")


def _choose(link: LinkEstimate, steps_left: int = 10_000, **kw):
    return choose_comm(link, 0.05, 1, TRAFFIC, 4, hooks=EVERYTHING,
                       cost=HookCost(steps_left=steps_left), **kw)


def test_auto_keeps_to_the_hooks_unless_asked_and_says_what_it_would_have_done():
    d = _choose(SLOW)
    assert d.comm in HOOK_NAMES
    h = d.predicted["diloco"]["sync_every"]
    assert f"diloco every {h} steps would be faster" in d.reason
    assert "auto_periodic is off" in d.reason and "changes the optimizer" in d.reason
    assert "comm=auto chose" in d.describe() and "every" in d.describe()
    asked = _choose(SLOW, auto_periodic=True)
    assert asked.comm == "diloco" and "would be faster" not in asked.reason


def test_auto_never_syncs_more_often_than_its_minimum_interval():
    d = _choose(FAIR, auto_periodic=True)
    p = d.predicted["diloco"]
    assert p["sync_every_needed"] == 10 < MIN_AUTO_SYNC_EVERY == p["sync_every"] == 50
    assert d.comm == "diloco"
    assert "every 50 steps: the budget needs 10" in d.reason
    # Off, it says the same periodic choice, at the same interval.
    off = _choose(FAIR)
    assert off.comm in HOOK_NAMES and "diloco every 50 steps would be faster" in off.reason


def test_a_run_too_short_for_two_minimum_intervals_gets_a_hook_and_the_reason():
    d = _choose(SLOW, steps_left=2 * MIN_AUTO_SYNC_EVERY - 1, auto_periodic=True)
    assert d.comm in HOOK_NAMES and not d.predicted["diloco"]["usable"]
    assert "needs two intervals in the 99 steps left" in d.reason


def test_a_hook_within_budget_wins_whatever_auto_periodic_says():
    fast = LinkEstimate(busbw_gbps=100.0, latency_s=1e-5, source="test")
    for allowed in (False, True):
        d = _choose(fast, auto_periodic=allowed)
        assert d.comm == "none" and "would be faster" not in d.reason


def test_auto_periodic_is_a_train_key_and_a_trainer_flag_off_by_default():
    assert TrainSpec().auto_periodic is False and parse_config([]).auto_periodic is False
    args = TrainSpec(auto_periodic=True).trainer_args()
    assert "--auto-periodic" in args and parse_config(args).auto_periodic is True
    assert parse_config(TrainSpec().trainer_args()).auto_periodic is False
