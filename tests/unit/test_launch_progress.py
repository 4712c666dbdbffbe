"""The system tests' background launch (tests/faults.py) bounds a stall, not the run: a loaded
machine stretches a run that still advances (`make test-loaded`), and only a run that stopped
advancing is stopped and failed."""

from __future__ import annotations

import subprocess
import sys

import faults
import pytest

STEPS = "import sys, time\nfor i in range({n}):\n    print('step', i, flush=True); time.sleep(0.2)\nsys.exit(3)\n"


def launch(tmp_path, program: str, timeout_s: float) -> faults.Launch:
    """A Launch over a stand-in for `fatpipe launch` (its output in launch.out, a run folder), once
    it made its first progress: an interpreter's start on a loaded machine is no stall."""
    run = object.__new__(faults.Launch)
    run.log, run.timeout_s, run.run_dir = tmp_path / "launch.out", timeout_s, tmp_path / "run"
    run.run_dir.mkdir()
    with open(run.log, "w") as out:
        run.proc = subprocess.Popen([sys.executable, "-c", program], stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    faults.wait_for("the first progress", lambda: run.progress() != (0, 0), 60, every_s=0.05)
    return run


def test_a_run_that_advances_past_the_bound_is_waited_for(tmp_path):
    run = launch(tmp_path, STEPS.format(n=12), timeout_s=1.5)  # 2.4 s of steps, 0.2 s apart
    assert run.finish() == 3


def test_a_run_that_stopped_advancing_is_stopped_and_fails(tmp_path):
    run = launch(tmp_path, "import time\nprint('step 0', flush=True)\ntime.sleep(60)\n", timeout_s=1)
    with pytest.raises(AssertionError, match="no progress for 1 s"):
        run.finish()
    assert run.proc.poll() is not None  # stopped, as Ctrl-C would


def test_a_node_logging_steps_is_progress_though_the_launch_prints_nothing(tmp_path):
    metrics = tmp_path / "run" / "live-node-1" / "metrics.jsonl"
    program = (f"import pathlib, time\np = pathlib.Path({str(metrics)!r})\np.parent.mkdir(parents=True)\n"
               "for i in range(12):\n    p.open('a').write('{}\\n'); time.sleep(0.2)\n")
    run = launch(tmp_path, program, timeout_s=1.5)
    assert run.finish() == 0
