"""How `fatpipe logs` tells an ended run: recorded exits first, then the nodes asked; a run
fatpipe stopped is no failure (ops.run.end)."""

from __future__ import annotations

from types import SimpleNamespace

from fatpipe.ops.run.end import ended_result, node_exits, stopped_by_fatpipe


def node(rank: int, state: str = "running", live: bool = False):
    asked = []
    return SimpleNamespace(name=f"n-{rank}", plan=SimpleNamespace(rank=rank), asked=asked,
                           status=lambda timeout=30: asked.append(1) or state,
                           rdzv=SimpleNamespace(live=live))


def test_recorded_exits_are_final_and_only_the_others_are_asked(tmp_path):
    (tmp_path / "node-0.exit").write_text("1\n")
    nodes = [node(0), node(1, "0"), node(2, "lost")]
    assert node_exits(tmp_path, nodes, gone=set()) == {"n-0": 1, "n-1": 0, "n-2": None}
    assert (nodes[0].asked, nodes[1].asked) == ([], [1])


def test_a_node_still_running_or_not_answering_means_no_verdict_yet(tmp_path):
    (tmp_path / "node-0.exit").write_text("1\n")
    assert node_exits(tmp_path, [node(0), node(1, "running")], gone=set()) is None
    assert node_exits(tmp_path, [node(0), node(1, "unreachable: timed out")], gone=set()) is None
    assert node_exits(tmp_path, [node(0), node(1, "not-started")], gone=set()) is None


def test_a_gone_node_is_not_asked_and_without_an_exit_file_was_lost(tmp_path):
    gone = node(1, "running")
    assert node_exits(tmp_path, [gone], gone={"n-1"}) == {"n-1": None} and gone.asked == []


def test_only_a_run_whose_every_bad_node_fatpipe_stopped_is_stopped(tmp_path):
    nodes = [node(0), node(1)]
    (tmp_path / "node-0.stop").touch()  # node 1 failed on its own; fatpipe then stopped node 0
    failed = ended_result("r", tmp_path, nodes, {"n-0": 143, "n-1": 1})
    assert failed.stopped == ["n-0"] and not stopped_by_fatpipe(failed) and failed.exit_code == 1
    (tmp_path / "node-1.stop").touch()  # `fatpipe stop` reached both
    assert stopped_by_fatpipe(ended_result("r", tmp_path, nodes, {"n-0": 143, "n-1": 143}))
    assert not stopped_by_fatpipe(ended_result("r", tmp_path, nodes, {"n-0": 0, "n-1": 0}))


def test_a_live_run_ends_as_its_survivors_did(tmp_path):
    # `fatpipe logs -f` reads the mode from the run's rendezvous: a node the run left is no failure.
    live = [node(0, live=True), node(1, live=True)]
    assert ended_result("r", tmp_path, live, {"n-0": 0, "n-1": None}).exit_code == 0
    assert ended_result("r", tmp_path, [node(0), node(1)], {"n-0": 0, "n-1": None}).exit_code == 255
