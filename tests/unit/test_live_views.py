"""A live run as `fatpipe top` and `fatpipe report` show it: each node's own window, a node that
stopped reporting marked gone, joins and leaves as events and as lines on the step-time plot."""

from __future__ import annotations

import json
import time

from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runs import new_run
from fatpipe.ops.plan.report import step_split_figure, write_report
from fatpipe.ops.rdzv.rendezvous import new_rendezvous
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.top import snapshot
from fatpipe.trainer.live.membership import QuorumWatch

from .test_rendezvous import sim_outputs

MEMBERSHIP = [{"step": 21, "event": "leave", "replica_groups": [3, 2], "seconds_lost": 2.9},
              {"step": 31, "event": "join", "replica_groups": [2, 3], "seconds_lost": 0.1}]


def live_run(project_dir):
    project = load_project()
    run_id, run_dir = new_run(project, "demo")
    train = project.train.model_copy(update={"fault_tolerance": "live"})
    new_rendezvous(Cluster(project, outputs=parse_outputs(sim_outputs(3))), run_id, run_dir, train=train)
    return project, run_dir


def write_view(folder, node: str, at: float, last_step: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    view = {"time": at, "window": 0, "attempt": 0, "first_step": 1, "last_step": last_step,
            "world_size": 1, "nodes": [{"node": node, "tx_gbps": 0.1, "rx_gbps": 0.1}]}
    (folder / "nodes.jsonl").write_text(json.dumps(view) + "\n")


def test_top_shows_each_live_node_and_the_one_that_stopped_reporting_as_gone(project_dir):
    from fatpipe.cli.top import render

    project, run_dir = live_run(project_dir)
    now = time.time()
    write_view(run_dir, "x", now, 40)
    write_view(run_dir / "live-node-1", "y", now - 1, 40)
    write_view(run_dir / "live-node-2", "z", now - 120, 20)  # its last window: long ago
    (run_dir / "events.jsonl").write_text(json.dumps(
        {"time": now - 100, "event": "node_left", "reason": "3 -> 2 replica groups at step 21",
         "last_step": 21}) + "\n")
    view = snapshot(Cluster.resolve(project, "demo"))
    assert [(n["node"], n["state"]) for n in view["nodes"]] == [
        ("demo-0", "up"), ("demo-1", "up"), ("demo-2", "gone")]
    assert view["events"][-1]["event"] == "node_left"
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(render(view))
    text = console.export_text()
    assert "gone" in text and "node_left: 3 -> 2 replica groups at step 21" in text


def test_the_report_marks_leaves_and_joins_and_lists_the_live_figures(project_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [{"step": s, "loss": 1.0, "step_s": 0.1, "sync_s": 0.01, "exposed_comm_s": 0.01,
                "participants": 2 if 21 <= s < 31 else 3} for s in range(1, 41)]
    fig, ax = plt.subplots()
    step_split_figure(records, MEMBERSHIP)(ax)
    marks = [(line.get_xdata()[0], line.get_label()) for line in ax.lines]
    plt.close(fig)
    assert marks == [(21, "node left"), (31, "node joined")]
    _, run_dir = live_run(project_dir)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.json").write_text(json.dumps({
        "fault_tolerance": "live", "membership": MEMBERSHIP, "skipped_batches": 10,
        "goodput": {"tokens": 1, "wall_s": 1.0, "tokens_per_s": 1.0}}))
    page = write_report(run_dir).read_text()
    assert "live fault tolerance" in page and "skipped_batches" in page and "seconds_lost" in page


def test_the_quorum_watch_names_each_change_once():
    watch = QuorumWatch()
    changes = [watch.update(step, groups) for step, groups in enumerate([3, 3, 2, 2, 3], start=1)]
    assert changes == [None, None, ("node_left", "3 -> 2 replica groups at step 3"), None,
                       ("node_joined", "2 -> 3 replica groups at step 5")]
