"""Faults on a real 3-node netns sim cluster: a killed worker, a killed torchrun agent, under both
fault tolerance modes.

One cluster is deployed for the module with the real `fatpipe` CLI and terraform, and destroyed
after it. Each test starts `fatpipe launch` (the built-in trainer, tiny preset, a checkpoint every
few steps), injects its fault from `faults` once the first checkpoint is behind the run, and checks
the outcome of its mode. Restart: the run ends at the requested step, redid at most one
checkpoint interval, and ends with the parameters of an uninterrupted run of the same world size
(3 processes under torchrun here). Live: the other nodes take every step once without the
victim, which comes back and ends with their parameters.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import faults
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

NAME, OCTET = "t-fault", 77
STEPS, EVERY = 40, 5
LIVE_STEPS = 150  # room for the victim's torchrun to start again and rejoin before the end
TRAIN = ["--preset", "tiny", "--steps", str(STEPS), "--batch-size", "4", "--seq-len", "64",
         "--warmup-steps", "3", "--checkpoint-every", str(EVERY), "--comm", "none"]
RUN_TIMEOUT_S = 200


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A deployed 3-node 1g netns sim cluster; its project folder. Destroyed after the module."""
    yield from faults.deployed_sim_cluster(tmp_path_factory, NAME, OCTET)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """summary.json of an uninterrupted run: 3 processes on this machine, same flags."""
    return faults.reference_run(tmp_path_factory.mktemp("reference") / "run", TRAIN, 3, RUN_TIMEOUT_S)


class Launch(faults.Launch):
    """The built-in trainer on the cluster, a checkpoint every EVERY steps, 2 restarts allowed."""

    def __init__(self, folder, mode: str):
        steps = LIVE_STEPS if mode == "live" else STEPS
        train = [str(steps) if arg == str(STEPS) else arg for arg in TRAIN]
        super().__init__(folder, NAME, [*train, "--max-restarts", "2", "--fault-tolerance", mode],
                         RUN_TIMEOUT_S)
        self.mode = mode

    def inject(self, fault) -> int:
        """Run `fault()` once the first checkpoint is behind the run and a few steps more, then
        wait for the end; returns the step logged when the fault came."""
        killed_after = []
        code = super().inject(lambda: killed_after.append(self.steps_logged()) or fault(),
                              EVERY + 2, checkpoint=True)
        assert code == 0, self.output()
        return killed_after[0]


def check_went_on(launch: Launch, victim: int) -> None:
    """Live: node 0 took every step once, the victim left and joined again, equal parameters."""
    assert [r["step"] for r in launch.metrics()] == list(range(1, LIVE_STEPS + 1))
    folders = [launch.run_dir, *(launch.run_dir / f"live-node-{r}" for r in (1, 2))]
    summaries = [json.loads((f / "summary.json").read_text()) for f in folders]
    assert len({s["param_digests"][0] for s in summaries}) == 1, summaries
    membership = summaries[0]["membership"]
    assert [m["event"] for m in membership][:2] == ["leave", "join"], \
        (membership, launch.node_log(victim)[-3000:])
    bound_s = faults.leave_bound_s(launch.metrics())  # seconds, not the victim's restart
    assert membership[0]["seconds_lost"] < bound_s, (bound_s, membership)


def check_resumed(launch: Launch, killed_after: int, reference: dict) -> dict:
    """The run ended at STEPS, redid at most one checkpoint interval, matches the reference."""
    summary = launch.summary()
    steps = [r["step"] for r in launch.metrics()]
    assert steps == list(range(1, STEPS + 1)), steps
    assert summary["steps"] == STEPS and summary["replicas_in_sync"]
    starts = [int(s) for s in re.findall(r"start at step (\d+)", launch.node_log(0))]
    assert len(starts) >= 2 and starts[0] == 0, starts
    # It resumed from the checkpoint before the fault, not from an older one or from scratch.
    assert 0 < killed_after - starts[-1] <= EVERY + 1, (killed_after, starts)
    assert summary["restarts"] >= 1, summary
    assert summary["param_digests"] == reference["param_digests"], \
        "the resumed run's parameters differ from an uninterrupted run's"
    return summary


@pytest.mark.parametrize("mode", ["restart", "live"])
def test_a_killed_worker_resumes_from_its_checkpoint_or_rejoins(needs_netns, cluster, reference, mode):
    launch = Launch(cluster, mode)
    killed_after = launch.inject(lambda: faults.kill_worker(faults.netns_name(NAME, 1)))
    if mode == "live":
        return check_went_on(launch, 1)
    summary = check_resumed(launch, killed_after, reference)
    assert summary["failed_collectives"] >= 1, summary
    assert summary["collectives_attempted"] > STEPS
    assert summary["sync_failure_rate"] == pytest.approx(
        summary["failed_collectives"] / summary["collectives_attempted"])


@pytest.mark.parametrize("mode", ["restart", "live"])
def test_a_killed_agent_is_restarted_and_the_run_finishes(needs_netns, cluster, reference, mode):
    launch = Launch(cluster, mode)

    def kill_agent_and_a_supervisor():
        faults.kill_agent(faults.netns_name(NAME, 2))
        # Node 1's supervisor killed alone (kill -9 of its recorded pid), not its trainer.
        os.kill(int((launch.run_dir / "node-1.pid").read_text()), signal.SIGKILL)

    killed_after = launch.inject(kill_agent_and_a_supervisor)
    assert "ended by signal KILL, not by fatpipe stop: starting it again" in launch.node_log(2)
    # Node 1 trained to the end under its keeper, which recorded its end: never "lost".
    assert (launch.run_dir / "node-1.exit").read_text().strip() == "0", launch.output()
    assert "the node's supervisor is gone: torchrun's status 0" in launch.node_log(1)
    if mode == "live":
        check_went_on(launch, 2)
    else:
        check_resumed(launch, killed_after, reference)
    # The killed agent's workers (nobody's children any more) did not outlive the run.
    assert not faults.workers(faults.netns_name(NAME, 2))


def test_link_faults_take_a_node_down_and_reshape_it(needs_netns, cluster):
    ns = faults.netns_name(NAME, 1)

    def link() -> str:
        return subprocess.run(["ip", "-n", ns, "-o", "link", "show", faults.NODE_IFACE],
                              capture_output=True, text=True, timeout=10).stdout

    def qdisc() -> str:
        return subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", faults.NODE_IFACE],
                              capture_output=True, text=True, timeout=10).stdout

    cut = faults.link_down_later(ns, 1.0)
    faults.wait_for("the link to go down", lambda: "state DOWN" in link(), 5, every_s=0.05)
    cut.join(timeout=10)
    assert not cut.is_alive() and ",UP" in link()
    try:
        faults.reshape(NAME, 1, 0.1)
        assert "rate 100Mbit" in qdisc()
    finally:
        faults.reshape(NAME, 1, 1.0)
    assert "rate 1Gbit" in qdisc()
