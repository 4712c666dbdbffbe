"""`fatpipe top` and the run's events on a real 4-node netns sim cluster with one slow link.

The cluster is deployed once with the real CLI and terraform; `fatpipe launch` trains the tiny
preset in the background. First, node 2's link is cut to a quarter of the tier (1g) before the
launch: while it trains, `fatpipe top --once --json` must name node 2 as the straggler for its
link, and the run's events.jsonl must name it too. Then a run starts on even links and node 1's
is cut mid-run: the sync time leaves the run's own baseline, and the event names node 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import faults
import pytest

from fatpipe.stacks.sim import net as simnet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NAME, OCTET, TIER = "tp-top", 143, 1.0
STEPS, EVERY = 150, 5  # long enough that the run still goes when top answers
TRAIN = ["--preset", "tiny", "--steps", str(STEPS), "--batch-size", "4", "--seq-len", "64", "--comm", "none",
         "--warmup-steps", "3", "--checkpoint-every", "1000", "--node-metrics-every", str(EVERY),
         "--max-restarts", "0", "--fault-tolerance", "restart"]  # one world: a straggler slows all
RUN_TIMEOUT_S = 300


def fatpipe(folder: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=faults.cli_env(), text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from faults.deployed_sim_cluster(tmp_path_factory, NAME, OCTET, nodes=4)


class Launch:
    """`fatpipe launch` of the built-in trainer in the background; Ctrl-C'd if a test leaves it."""

    def __init__(self, folder: Path):
        self.folder, self.log = folder, folder / "launch.out"
        runs = folder / ".fatpipe" / NAME / "runs"
        self.before = {p.name for p in runs.iterdir()} if runs.is_dir() else set()  # an earlier test's
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "fatpipe.cli", "launch", NAME, *TRAIN,
                                          "--timeout", str(RUN_TIMEOUT_S)], cwd=folder, env=faults.cli_env(),
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:  # Ctrl-C: fatpipe stops every node
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=60)

    def top(self) -> dict | None:
        """`fatpipe top --once --json`, or None before this run has its first window."""
        assert self.proc.poll() is None, f"the launch ended early:\n{self.log.read_text()[-3000:]}"
        done = fatpipe(self.folder, "top", NAME, "--once", "--json", timeout=60)
        if done.returncode == 0:
            view = json.loads(done.stdout)
            return None if view["run"] in self.before else view  # the latest is still the last test's
        # Before the rendezvous or the first window: one line saying so.
        assert done.returncode == 1 and ("no node metrics yet" in done.stderr
                                         or "has no runs yet" in done.stderr), done.stderr
        return None

    def until(self, what: str, ready, timeout_s: float = RUN_TIMEOUT_S - 60) -> dict:
        deadline, last = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            last = self.top()
            if last and ready(last):
                return last
            time.sleep(1)
        raise AssertionError(f"no {what} in {timeout_s} s; last view: {last}")

    def finish(self) -> Path:
        """Wait for a clean end; the run folder."""
        assert self.proc.wait(timeout=RUN_TIMEOUT_S + 60) == 0, self.log.read_text()[-4000:]
        return Path(json.loads(fatpipe(self.folder, "status", NAME, "--json").stdout)["run"]["dir"])


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_top_and_events_name_the_node_with_the_slow_link(cluster):
    slow = f"{NAME}-2"
    simnet.reshape_node(NAME, 2, TIER / 4)
    try:
        with Launch(cluster) as launch:
            view = launch.until("straggler while training", lambda v: v["straggler"] and not v["finished"])
            run_dir = launch.finish()
    finally:
        simnet.reshape_node(NAME, 2, TIER)
    assert view["straggler"]["node"] == slow and view["straggler"]["kind"] == "link", view["straggler"]
    assert f"{slow}: link" in view["straggler"]["reason"] and "tier 1" in view["straggler"]["reason"]
    assert [n["node"] for n in view["nodes"]] == [f"{NAME}-{i}" for i in range(4)]
    slowest = min(view["nodes"], key=lambda n: n["link_gbps"] or 99)
    assert slowest["node"] == slow and slowest["link_gbps"] < 1.6 * TIER / 4  # its shaped rate
    assert all(n["sync_s_p50"] > 0 and n["tx_gbps"] > 0 for n in view["nodes"])
    named = [e for e in events(run_dir) if e["event"] == "straggler"]
    assert named and named[0]["node"] == slow and named[0]["kind"] == "link", events(run_dir)
    assert len((run_dir / "nodes.jsonl").read_text().splitlines()) >= STEPS // EVERY - 2


def test_a_link_cut_mid_run_is_a_sync_event_naming_the_node(cluster):
    slow = f"{NAME}-1"
    try:
        with Launch(cluster) as launch:
            # The baseline is the median of the first windows; cut the link once it is set.
            launch.until("baseline", lambda v: v["window"]["window"] >= 4)
            simnet.reshape_node(NAME, 1, TIER / 4)
            run_dir = launch.finish()
    finally:
        simnet.reshape_node(NAME, 1, TIER)
    found = events(run_dir)
    slow_sync = [e for e in found if e["event"] == "sync_slow"]
    assert slow_sync and slow_sync[0]["node"] == slow and slow_sync[0]["ratio"] >= 2, found
    assert slow_sync[0]["first_step"] > 4 * EVERY  # after the cut, not in the baseline
    assert any(e["event"] == "straggler" and e["node"] == slow for e in found), found
