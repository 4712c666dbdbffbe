"""A launch whose links are cut mid-run, for the comm=auto re-decision tests: `fatpipe launch`
in the background on a deployed netns sim cluster, every link reshaped once the run has logged
some steps, and the launch waited for (it must succeed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import faults

from fatpipe.stacks.sim import net as simnet

CUT_GBIT = 0.02  # 20 Mbit/s: far below what plain all-reduce of the test's models needs


def launch_and_cut(cluster: Path, name: str, nodes: int, launch_args: list[str], cut_after: int,
                   timeout_s: float) -> tuple[Path, int, str]:
    """(the run folder, the step count logged when the links were cut, the launch's output)."""
    runs = cluster / ".fatpipe" / name / "runs"
    log = cluster / "launch.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fatpipe.cli", "launch", name, *launch_args],
            cwd=cluster, env=faults.cli_env(), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        def logged() -> Path | None:
            assert proc.poll() is None, log.read_text()[-4000:]
            for run in runs.glob("2*"):
                metrics = run / "metrics.jsonl"
                if metrics.exists() and len(metrics.read_text().splitlines()) >= cut_after:
                    return run
            return None

        run = faults.wait_for("the run's first steps", logged, timeout_s, every_s=0.1)
        cut_at = len((run / "metrics.jsonl").read_text().splitlines())
        for i in range(nodes):
            simnet.reshape_node(name, i, CUT_GBIT)
        assert proc.wait(timeout=timeout_s + 120) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
    return run, cut_at, log.read_text()
