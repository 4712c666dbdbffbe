"""Faults on a real 3-node netns sim cluster: a killed worker, a killed torchrun agent; the run resumes.

One cluster is deployed for the module with the real `fatpipe` CLI and terraform, and destroyed
after it. Each test starts `fatpipe launch` (the built-in trainer, tiny preset, a checkpoint every
few steps), injects its fault from `faults` once the first checkpoint is behind the run, and checks
that the run ends at the requested step, redid at most one checkpoint interval, and ends with the
parameters of an uninterrupted run of the same world size (3 processes under torchrun here).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import faults
import pytest
from conftest import netns_available, skip_or_fail

from fatpipe.stacks import simnet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NAME, OCTET = "t-fault", 77
STEPS, EVERY = 40, 5
TRAIN = ["--preset", "tiny", "--steps", str(STEPS), "--batch-size", "4", "--seq-len", "64",
         "--warmup-steps", "3", "--checkpoint-every", str(EVERY), "--comm", "none"]
RUN_TIMEOUT_S = 200


def fatpipe(folder: Path, *args: str, timeout: float = 240, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=_env(),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout, **popen)


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("FATPIPE_CONFIG", None)
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A deployed 3-node 1g netns sim cluster; its project folder. Destroyed after the module."""
    if not netns_available():
        skip_or_fail("needs root and `ip netns`")
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform on PATH")
    folder = tmp_path_factory.mktemp("faults")
    (folder / "fatpipe.toml").write_text(
        f'[clusters.{NAME}]\nprovider = "sim"\nnodes = 3\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "10.{OCTET}.0.0/24"\nrdzv_port = {29500 + OCTET}\n')
    try:
        done = fatpipe(folder, "deploy", NAME, "--yes")
        assert done.returncode == 0, done.stdout[-4000:]
        yield folder
    finally:
        fatpipe(folder, "down", NAME, timeout=180)
        simnet.sweep_cluster(NAME, folder / ".fatpipe" / NAME / "nodes")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """summary.json of an uninterrupted run: 3 processes on this machine, same flags."""
    out = tmp_path_factory.mktemp("reference") / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
           "-m", "fatpipe.trainer", *TRAIN, "--out", str(out)]
    done = subprocess.run(cmd, env={**_env(), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:]
    return json.loads((out / "summary.json").read_text())


class Launch:
    """`fatpipe launch` of the built-in trainer on the cluster, running in the background."""

    def __init__(self, folder: Path):
        self.log = folder / "launch.out"
        runs = folder / ".fatpipe" / NAME / "runs"
        before = set(runs.iterdir()) if runs.is_dir() else set()
        with open(self.log, "w") as out:
            # A session of its own: stop() signals it as Ctrl-C would, and fatpipe stops the nodes.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fatpipe.cli", "launch", NAME, *TRAIN, "--max-restarts",
                 "2", "--timeout", str(RUN_TIMEOUT_S)],
                cwd=folder, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            self.run_dir = faults.wait_for("the run folder", lambda: self._run(runs, before), 60)
        except BaseException:
            self.stop()
            raise

    def _run(self, runs: Path, before: set[Path]) -> Path | None:
        """This launch's run folder: the new one, once its rendezvous is written."""
        if self.proc.poll() is not None:
            raise AssertionError(f"launch ended early:\n{self.output()}")
        new = [p for p in runs.glob("2*") if p not in before and (p / "rendezvous.json").exists()]
        return new[0] if len(new) == 1 else None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def steps_logged(self) -> int:
        metrics = self.run_dir / "metrics.jsonl"
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    def past_first_checkpoint(self, timeout_s: float = 150) -> int:
        """Wait until a checkpoint exists and the run is a few steps past it; the step logged."""
        def ready() -> int:
            if self.proc.poll() is not None:
                raise AssertionError(f"launch ended before the fault:\n{self.output()}")
            ckpts = list((self.run_dir / "checkpoints").glob("step-*.pt"))
            steps = self.steps_logged()
            return steps if ckpts and steps >= EVERY + 2 else 0

        return faults.wait_for("the first checkpoint", ready, timeout_s, every_s=0.05)

    def finish(self) -> int:
        """Wait for the launch to end (its own --timeout stops the nodes); its exit status."""
        try:
            return self.proc.wait(timeout=RUN_TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def stop(self) -> None:
        """Ctrl-C: fatpipe stops every node; then whatever is left of the launch is killed."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def inject(self, fault) -> int:
        """Run `fault()` once the first checkpoint is behind the run, then wait for the end;
        returns the step logged when the fault came. Stops the launch if anything fails."""
        try:
            killed_after = self.past_first_checkpoint()
            fault()
            code = self.finish()
        except BaseException:
            self.stop()
            raise
        assert code == 0, self.output()
        return killed_after

    def node_log(self, rank: int) -> str:
        return (self.run_dir / f"node-{rank}.log").read_text(errors="replace")


def check_resumed(launch: Launch, killed_after: int, reference: dict) -> dict:
    """The run ended at STEPS, redid at most one checkpoint interval, matches the reference."""
    summary = json.loads((launch.run_dir / "summary.json").read_text())
    steps = [json.loads(line)["step"] for line in
             (launch.run_dir / "metrics.jsonl").read_text().splitlines()]
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


def test_a_killed_worker_resumes_from_its_checkpoint(needs_netns, cluster, reference):
    launch = Launch(cluster)
    killed_after = launch.inject(lambda: faults.kill_worker(faults.netns_name(NAME, 1)))
    summary = check_resumed(launch, killed_after, reference)
    assert summary["failed_collectives"] >= 1, summary
    assert summary["collectives_attempted"] > STEPS
    assert summary["sync_failure_rate"] == pytest.approx(
        summary["failed_collectives"] / summary["collectives_attempted"])


def test_a_killed_agent_is_restarted_and_the_run_finishes(needs_netns, cluster, reference):
    launch = Launch(cluster)
    killed_after = launch.inject(lambda: faults.kill_agent(faults.netns_name(NAME, 2)))
    assert "ended by signal KILL, not by fatpipe stop: starting it again" in launch.node_log(2)
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
