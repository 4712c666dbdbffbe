"""Joins, leaves, goodput and unread data of a live run, from the records its steps leave."""

from __future__ import annotations

from fatpipe.trainer.live.membership import goodput, membership, skipped_batches


def records(participants: list[int], step_s: float = 1.0, gaps: dict[int, float] | None = None):
    out, t = [], 100.0
    for step, n in enumerate(participants, 1):
        t += step_s + (gaps or {}).get(step, 0.0)
        out.append({"step": step, "participants": n, "time": t, "step_s": step_s})
    return out


def test_a_leave_and_a_join_with_what_each_cost():
    recs = records([3, 3, 2, 2, 2, 3, 3], gaps={3: 4.0, 6: 1.5})
    assert membership(recs) == [
        {"step": 3, "event": "leave", "replica_groups": [3, 2], "seconds_lost": 4.0},
        {"step": 6, "event": "join", "replica_groups": [2, 3], "seconds_lost": 1.5},
    ]


def test_a_steady_run_has_no_changes_and_full_goodput():
    recs = records([2] * 10)
    assert membership(recs) == []
    assert goodput(recs, 1000) == {"tokens": 20000, "wall_s": 10.0, "tokens_per_s": 2000.0}
    assert skipped_batches(recs, 2, 4) == 0


def test_the_data_of_a_node_that_is_down_is_counted_unread():
    recs = records([3, 2, 2, 3])
    assert skipped_batches(recs, 3, 4) == 8  # two steps without one node of 4 batches a step
    assert goodput(recs, 10)["tokens"] == 100


def test_records_without_membership_say_nothing():
    assert membership([{"step": 1, "step_s": 1.0}]) == []
    assert goodput([], 10)["tokens_per_s"] == 0.0
