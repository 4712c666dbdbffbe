"""`up`'s walk (issue 44, item 1): each phase crosses from cli into ops with the run once, and a
launch's rendezvous and a push's cluster come back to no ops room they left, traced by a profile
hook over real commands on two local nodes (bench/reentry.py, which reads calls, not imports). A phase that does its work through several ops calls from the command
(the launch's firewall check, data check and launch, as before `ops/run/training.py`) fails here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def bench_reentry():
    spec = importlib.util.spec_from_file_location("bench_reentry", REPO / "bench" / "reentry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_phase_of_up_crosses_into_ops_once(project_dir):
    reentry = bench_reentry()
    reentry.local_cluster(project_dir)
    walk = reentry.walk_up(["--netcheck", "quick", "--", "train.py"])
    work = {phase: steps for phase, steps in walk.items() if not phase.startswith("before ")}
    # Reused deployment: synth to wait are skipped, on one decision made before them.
    assert {phase: len(steps) for phase, steps in work.items()} == {
        "synth": 0, "wheels": 0, "deploy": 0, "wait": 0, "netcheck": 1, "data": 1, "rendezvous": 1,
        "launch": 1, "summary": 0}, walk
    assert walk["before synth"] == ["up.py -> reach/deployment.py:ready_deployment"]
    assert walk["before netcheck"] == ["up.py -> run/guard.py:refuse_if_running",
                                       "up.py -> reach/deployment.py:reusable_netcheck"]
    assert work["launch"] == ["steps.py -> run/training.py:launch_training"]


def test_a_launchs_rendezvous_and_a_pushs_cluster_come_back_to_no_room(project_dir):
    """Done-when of item 1: traced through ops, neither steps back into an ops room it had left."""
    reentry = bench_reentry()
    reentry.local_cluster(project_dir)
    pushed = reentry.traced(["data", "push"], reentry.carries_outputs)
    launched = reentry.traced(["launch", "--", "train.py"], reentry.is_rendezvous)
    assert pushed["calls"] and launched["calls"]
    assert (pushed["rooms"]["re_entries"], launched["rooms"]["re_entries"]) == (0, 0), (pushed["path"],
                                                                                        launched["path"])


def test_the_walk_sees_a_phase_that_crosses_twice():
    """The check itself: a phase whose command-side code makes two ops calls with the cluster counts
    two; its own reads of the cluster (a method, a property) count none."""
    import io
    import sys

    from rich.console import Console

    from fatpipe.cli import steps
    from fatpipe.cli.render import Phases
    from fatpipe.ops.data.check import require_data
    from fatpipe.ops.reach.cluster import Cluster

    body = {"require_data": require_data}  # a command's phase code, as if written in cli/steps.py
    exec(compile("def phase(cluster):\n    cluster.logging(print)\n    require_data(cluster)\n"
                 "    require_data(cluster)\n", steps.__file__, "exec"), body)
    cluster = Cluster(None, outputs=None)
    cluster.__class__ = type("Cluster", (Cluster,), {"data": None})  # no [data]: each call returns at once
    walk = bench_reentry().PhaseWalk()
    sys.setprofile(walk)
    try:
        Phases(Console(file=io.StringIO())).run("launch", "two calls", lambda: body["phase"](cluster))
    finally:
        sys.setprofile(None)
    assert walk.crossings == {"launch": ["steps.py -> data/check.py:require_data"] * 2}
