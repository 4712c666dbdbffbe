"""What a live run reports is true: the phase table does not say every node exit 0 above a node
lost, the sync failure rate counts the exchanges that failed (steps that did not commit), and the
size is the cluster's replica groups with their leaves and joins, not one node's torchrun world;
node 0 keeps a copy of its own record beside the run's."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from fatpipe.cli.render import summary_table
from fatpipe.ops.rdzv.noderun import LaunchResult
from fatpipe.ops.rdzv.record import NodePlan, Rendezvous
from fatpipe.ops.run.end import ended_note
from fatpipe.ops.run.leader import leader_index
from fatpipe.ops.run.summary import run_summary
from fatpipe.trainer.live.membership import Attempts, exchanges
from fatpipe.trainer.metrics import MetricsLog, read_metrics


def shown(doc: dict) -> str:
    console = Console(width=200, record=True)
    console.print(summary_table(doc))
    return " ".join(console.export_text().replace("│", " ").split())


def test_the_phase_note_names_the_node_a_live_run_went_on_without():
    lost = LaunchResult("r", Path("r"), {"c-0": 0, "c-1": 0, "c-2": None}, live=True)
    assert lost.ok
    assert ended_note(lost) == "2 of 3 node(s) exit 0; the run went on without c-2 (lost)"
    every = LaunchResult("r", Path("r"), {"c-0": 0, "c-1": 0}, live=True)
    assert ended_note(every) == "all 2 node(s) exit 0"
    failed = LaunchResult("r", Path("r"), {"c-0": 0, "c-1": 3})
    assert ended_note(failed) == "worst exit 3"


def test_a_live_summary_shows_replica_groups_leaves_joins_and_the_failed_exchanges(tmp_path):
    # Node 2 lost after step 100 of 200: the survivors' step 101 took two attempts.
    (tmp_path / "summary.json").write_text(json.dumps({
        "final_loss": 3.2, "steps": 200, "world_size": 1, "restarts": 0, "fault_tolerance": "live",
        "nodes": 3, "membership": [{"step": 101, "event": "leave"}], "failed_collectives": 0,
        "collectives_attempted": 202, "sync_exchanges": 201, "failed_exchanges": 1,
        "sync_failure_rate": 1 / 201}))
    text = shown(run_summary(tmp_path, tier_gbps=1))
    assert "replica groups / leaves / joins 3 / 1 / 0" in text, text
    assert "0.50% (1 of 201 exchanges across the replica groups failed)" in text, text
    assert "world size" not in text and "0 of 202" not in text


def test_a_restart_summary_keeps_its_world_size_and_restarts(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({
        "steps": 40, "world_size": 6, "restarts": 1, "failed_collectives": 1,
        "collectives_attempted": 184, "sync_failure_rate": 1 / 184}))
    text = shown(run_summary(tmp_path, tier_gbps=1))
    assert "world size / restarts 6 / 1" in text and "(1 of 184 collectives failed)" in text


def test_failed_attempts_count_at_the_step_they_were_for():
    attempts = Attempts()
    attempts.begin(7)
    attempts.begin(7)
    assert attempts.of(7) == 2  # one failed exchange, then the commit
    attempts.begin(8)
    attempts.begin(8)
    assert attempts.of(30) == 1  # healed to the quorum's step: the failures were not the run's
    records = [{"step": 7, "attempts": 2}, {"step": 8}, {"step": 9, "attempts": 1}]
    assert exchanges(records) == {"sync_exchanges": 4, "failed_exchanges": 1, "sync_failure_rate": 0.25}


def test_node_0_keeps_a_copy_of_its_own_record(tmp_path):
    own = tmp_path / "live-node-0"
    log = MetricsLog(tmp_path, None, mirror=own)
    recs = [{"step": s, "loss": 1.0, "step_s": 0.1, "tokens_per_s": 1.0, "sync_s": 0.0,
             "exposed_comm_s": 0.0, "wire_bytes": 0, "grad_bytes": 0, "busbw_gbps": 0.0,
             "nic_tx_gbps": 0.0, "comm": "none"} for s in (1, 2)]
    for rec in recs:
        log.log(rec)
    log.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == recs == read_metrics(own / "metrics.jsonl")


def test_under_live_the_leader_is_the_lowest_node_that_finished(tmp_path):
    """`pull`, `[run] pull` and `status` ask the leader: under live every node records group rank
    0 of its own world, and node 0 may be the node the run went on without."""
    nodes = [NodePlan(rank=i, name=f"n-{i}", transport="local", private_ip=f"10.0.0.1{i}",
                      public_ip=None, netns=None, workdir="/nowhere", python="true") for i in range(3)]
    rdzv = Rendezvous(run_id="r1", cluster="c", provider="ssh", nnodes=3, nproc_per_node=1,
                      rdzv_backend="c10d", rdzv_endpoint="10.0.0.10:1", max_restarts=2,
                      join_timeout_s=10, run_rel="runs/r1", entry=[], builtin_trainer=True,
                      tier_gbps=1, created="", nodes=nodes, fault_tolerance="live")
    for rank in range(3):
        (tmp_path / f"node-{rank}.group-rank").write_text("0\n")
    assert leader_index(rdzv, tmp_path) == 0  # until a node finished
    (tmp_path / "node-2.exit").write_text("0\n")
    (tmp_path / "node-1.exit").write_text("0\n")
    assert leader_index(rdzv, tmp_path) == 1
