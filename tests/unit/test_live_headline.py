"""A live run's record is the run's, not node 0's: made from every node's own record (each node's
`live-node-<k>/`), each step from the lowest node that took part in it, the summary's counts over
the merged steps (ops.run.headline). Node 0 cut off from its peers for steps 11-20 of 40: it
committed nothing alone and healed from a peer at step 21."""

from __future__ import annotations

import json
from pathlib import Path

from fatpipe.ops.run.headline import keep_headline, merge_steps, node_views
from fatpipe.trainer.metrics import read_metrics

STEPS, CUT, BACK = 40, range(11, 21), 21
BATCHES = 4  # per node and step


def record(step: int, participants: int, node: int, **extra) -> dict:
    return {"step": step, "loss": 5.0 - step / 100 + node / 1000, "lr": 1e-3, "step_s": 0.1,
            "tokens_per_s": 1000.0, "sync_s": 0.02, "exposed_comm_s": 0.01, "grad_bytes": 100,
            "wire_bytes": 100, "busbw_gbps": 1.0, "nic_tx_gbps": 0.5, "nic_rx_gbps": 0.5,
            "comm": "none", "participants": participants, "healed": False, "quorum_s": 0.01,
            "attempts": 1, "time": 1000.0 + step * 0.1 + (30.0 if step >= CUT[0] else 0.0),
            **extra}


def survivor(node: int) -> list[dict]:
    """Nodes 1 and 2: every step; the first without node 0 took a second attempt."""
    return [record(s, 2 if s in CUT or s == BACK else 3, node,
                   attempts=2 if s == CUT[0] else 1) for s in range(1, STEPS + 1)]


def node_0() -> list[dict]:
    """Node 0: nothing while cut off; sent the live state at the step it came back in."""
    return [record(s, 3, 0) for s in range(1, CUT[0])] + [record(BACK, 2, 0, healed=True)] + \
        [record(s, 3, 0) for s in range(BACK + 1, STEPS + 1)]


def summary(node: int, records: list[dict]) -> dict:
    """What each node's trainer wrote of its own record (node 0's counts are of its own view)."""
    return {"steps": len(records), "final_loss": records[-1]["loss"], "fault_tolerance": "live",
            "node": f"node-{node}", "nodes": 3, "node_tokens": 512, "batches_per_node_step": BATCHES,
            "world_size": 3, "restarts": 0, "param_digests": ["same"], "replicas_in_sync": True,
            "eval_loss": 4.5, "skipped_batches": 0 if node == 0 else 11 * BATCHES}


def write_node(run_dir: Path, node: int, records: list[dict], finished: bool = True) -> None:
    folder = run_dir / f"live-node-{node}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if finished:
        (folder / "summary.json").write_text(json.dumps(summary(node, records)))


def cut_off_run(run_dir: Path) -> Path:
    write_node(run_dir, 0, node_0())
    write_node(run_dir, 1, survivor(1))
    write_node(run_dir, 2, survivor(2))
    # The run folder's own record as node 0 left it: its own view, with the hole.
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in node_0()))
    (run_dir / "summary.json").write_text(json.dumps(summary(0, node_0())))
    return run_dir


def test_the_run_folder_holds_every_step_and_the_summary_counts_what_the_quorum_did(tmp_path):
    run_dir = cut_off_run(tmp_path)
    assert keep_headline(run_dir)
    steps = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # no hole
    by = {r["step"]: r["recorded_by"] for r in steps}
    assert {by[s] for s in range(1, CUT[0])} == {0} and {by[s] for s in range(BACK + 1, STEPS + 1)} == {0}
    assert {by[s] for s in CUT} == {1}
    assert by[BACK] == 1  # node 0 was sent the state at that step: its loss is of old weights
    doc = json.loads((run_dir / "summary.json").read_text())
    assert doc["steps"] == STEPS
    assert doc["membership"] == [
        {"step": CUT[0], "event": "leave", "replica_groups": [3, 2], "seconds_lost": 30.0},
        {"step": BACK + 1, "event": "join", "replica_groups": [2, 3], "seconds_lost": 0.0}]
    assert doc["skipped_batches"] == (len(CUT) + 1) * BATCHES  # steps 11-21 without node 0
    assert (doc["failed_exchanges"], doc["sync_exchanges"]) == (1, STEPS + 1)
    assert doc["sync_failure_rate"] == 1 / (STEPS + 1)
    assert "node" not in doc and doc["replicas_in_sync"] is True
    assert doc["record"]["steps_by_node"] == {"0": 29, "1": 11, "2": 0}
    assert doc["eval_loss"] == 4.5  # what a finished node measured stays


def test_a_second_merge_and_a_pull_of_node_0s_copy_again_say_the_same(tmp_path):
    run_dir = cut_off_run(tmp_path)
    keep_headline(run_dir)
    first = ((run_dir / "metrics.jsonl").read_text(), (run_dir / "summary.json").read_text())
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in node_0()))
    keep_headline(run_dir)
    assert ((run_dir / "metrics.jsonl").read_text(), (run_dir / "summary.json").read_text()) == first


def test_node_0_destroyed_the_others_hold_the_run_and_the_lowest_finished_node_sums_it_up(tmp_path):
    """Node 0's disk went with it: nothing of it here; node 1 finished, node 2 was lost too."""
    write_node(tmp_path, 1, survivor(1))
    write_node(tmp_path, 2, survivor(2)[:15], finished=False)
    keep_headline(tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == list(range(1, STEPS + 1))
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["steps"] == STEPS and doc["record"]["finished"] == [1]


def test_nodes_that_end_apart_are_not_in_sync(tmp_path):
    cut_off_run(tmp_path)
    other = json.loads((tmp_path / "live-node-2" / "summary.json").read_text())
    (tmp_path / "live-node-2" / "summary.json").write_text(json.dumps({**other, "param_digests": ["apart"]}))
    keep_headline(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["replicas_in_sync"] is False


def test_a_step_taken_again_after_every_node_was_lost_is_the_later_one():
    """Node 0 recorded steps 5-6 and was lost; the others resumed at 4 and took 5-6 again."""
    stale = [{"step": s, "time": 100.0 + s} for s in range(1, 7)]
    again = [{"step": s, "time": 100.0 + s} for s in range(1, 5)] + \
        [{"step": s, "time": 200.0 + s} for s in (5, 6)]
    merged = merge_steps({0: stale, 1: again})
    assert [(r["step"], r["recorded_by"]) for r in merged] == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 1), (6, 1)]


def test_an_old_run_folder_is_node_0s_own_record_and_a_folder_without_nodes_is_left_alone(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in node_0()))
    assert node_views(tmp_path) == {}
    assert not keep_headline(tmp_path)  # a restart run: nothing to merge, nothing written
    assert read_metrics(tmp_path / "metrics.jsonl") == node_0()
    write_node(tmp_path, 1, survivor(1))
    assert sorted(node_views(tmp_path)) == [0, 1]  # before node 0 kept a copy of its own
