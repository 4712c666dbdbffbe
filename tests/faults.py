"""Fault injection on a deployed netns sim cluster, for tests: kill a node's trainer worker or its
torchrun agent, take its link down for a while, change its link rate, kill a checkpoint's writer;
and the harness around them: deploy a sim cluster, run `fatpipe launch` in the background, an
uninterrupted reference run to compare parameters with.

A sim node is a network namespace on this machine (`fp-<cluster>-<index>`); what runs on it is
what `ip netns pids` lists there. Every call is bounded: nothing here waits without a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fatpipe.trainer.live.manager import COLLECTIVE_TIMEOUT_S, QUORUM_TIMEOUT_S
from fatpipe.trainer.metrics import read_metrics

NODE_IFACE = "eth0"  # the node's end of its veth (fatpipe.stacks.sim.links.NODE_IFACE)
AGENT_MODULE = "torch.distributed.run"
CMD_TIMEOUT_S = 10
HANG_FACTOR = 4  # a launch's own --timeout: this many times its test's stall bound (Launch)


def netns_name(cluster: str, index: int) -> str:
    return f"fp-{cluster}-{index}"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)


def netns_pids(ns: str) -> list[int]:
    """The processes running in namespace `ns`."""
    return [int(p) for p in _ip("netns", "pids", ns).stdout.split()]


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def agents(ns: str) -> list[int]:
    """The torchrun agents running on the node."""
    return [p for p in netns_pids(ns) if AGENT_MODULE in cmdline(p)]


def workers(ns: str, module: str = "fatpipe.trainer") -> list[int]:
    """The node's worker processes: those running `module` that are not torchrun itself."""
    return [p for p in netns_pids(ns)
            if module in cmdline(p) and AGENT_MODULE not in cmdline(p)]


def wait_for(what: str, check: Callable[[], object], timeout_s: float, every_s: float = 0.1):
    """Poll `check` until it returns something true; that value, or AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def kill_worker(ns: str, rank: int | None = None, sig: int = signal.SIGKILL,
                timeout_s: float = 60) -> int:
    """Send `sig` (default SIGKILL) to one trainer worker on the node (global `rank` if given);
    returns its pid."""
    def pick() -> int | None:
        for pid in workers(ns):
            if rank is None or environ(pid).get("RANK") == str(rank):
                return pid
        return None

    pid = wait_for(f"a worker on {ns}", pick, timeout_s)
    os.kill(pid, sig)
    return pid


def kill_agent(ns: str, sig: int = signal.SIGKILL, timeout_s: float = 60) -> int:
    """Send `sig` (default SIGKILL) to the node's torchrun agent; returns its pid."""
    pid = wait_for(f"torchrun on {ns}", lambda: next(iter(agents(ns)), None), timeout_s)
    os.kill(pid, sig)
    return pid


def set_link(ns: str, up: bool) -> None:
    done = _ip("-n", ns, "link", "set", NODE_IFACE, "up" if up else "down")
    if done.returncode != 0:
        raise RuntimeError(f"ip -n {ns} link set {NODE_IFACE}: {done.stderr.strip()}")


def link_down(ns: str, seconds: float) -> None:
    """Take the node's link down for `seconds`, then up again (blocks that long)."""
    set_link(ns, up=False)
    try:
        time.sleep(seconds)
    finally:
        set_link(ns, up=True)


def link_down_later(ns: str, seconds: float) -> threading.Thread:
    """link_down in a daemon thread; join it (with a timeout) to know the link is back."""
    thread = threading.Thread(target=link_down, args=(ns, seconds), daemon=True,
                              name=f"link-down-{ns}")
    thread.start()
    return thread


def reshape(cluster: str, index: int, rate_gbit: float) -> None:
    """Set node `index`'s link rate (both directions), as a slow or congested node."""
    from fatpipe.stacks.sim.net import reshape_node

    reshape_node(cluster, index, rate_gbit)


def leave_bound_s(records: list[dict]) -> float:
    """What a lost node may cost the others of a live run, from their own steps' records: the
    exchange that failed waits at most the collective timeout, the next quorum at most one
    request (one lost with a dead Lighthouse is asked again), and the failed attempt's work and
    the retried step's take about two of the run's median steps (a loaded machine stretches
    those as it stretches every step). Waiting for the lost node's restart costs more."""
    median_s = statistics.median(r["step_s"] for r in records)
    return COLLECTIVE_TIMEOUT_S + QUORUM_TIMEOUT_S + 2 * median_s


def kill_checkpoint_writer(checkpoints: Path, step: int, timeout_s: float = 120) -> int:
    """SIGKILL the process writing checkpoint `step`, between its temporary file and the rename
    (the trainer pauses there under FATPIPE_TEST_CHECKPOINT_PAUSE_S); returns its pid."""
    pattern = f".step-{step:08d}.pt.tmp-*"
    tmp = wait_for(f"{pattern} in {checkpoints}",
                   lambda: next(iter(checkpoints.glob(pattern)), None), timeout_s, every_s=0.05)
    pid = int(tmp.name.rpartition("-")[2])  # the writer's pid names its temporary file
    os.kill(pid, signal.SIGKILL)
    return pid


# ---- the harness: a sim cluster, a launch in the background, a reference run ----------------


def cli_env(**extra: str) -> dict[str, str]:
    # FATPIPE_ON_SIGNAL=stop: the Ctrl-C (no terminal) that ends a test's launch stops its run, as
    # an unattended run asks; tests/system/test_interrupt.py tests the default, detach.
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "FATPIPE_ON_SIGNAL": "stop",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra}
    env.pop("FATPIPE_CONFIG", None)
    return env


def fatpipe(folder: Path, *args: str, timeout: float = 240, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=cli_env(),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout, **popen)


@contextlib.contextmanager
def sim_cluster(folder: Path, name: str, octet: int, nodes: int = 3):
    """A deployed 1g netns sim cluster in `folder` (10.<octet>.0.0/24); destroyed on exit."""
    from fatpipe.stacks.sim import net as simnet

    (folder / "fatpipe.toml").write_text(
        f'[clusters.{name}]\nprovider = "sim"\nnodes = {nodes}\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "10.{octet}.0.0/24"\nrdzv_port = {29500 + octet}\n')
    try:
        done = fatpipe(folder, "deploy", name, "--yes")
        assert done.returncode == 0, done.stdout[-4000:]
        yield folder
    finally:
        fatpipe(folder, "down", name, timeout=180)
        simnet.sweep_cluster(name, folder / ".fatpipe" / name / "nodes")


def reference_run(out: Path, train: list[str], nproc: int, timeout_s: float) -> dict:
    """summary.json of an uninterrupted run of `nproc` processes on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), "-m", "fatpipe.trainer", *train, "--out", str(out)]
    done = subprocess.run(cmd, env=cli_env(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-4000:]
    return json.loads((out / "summary.json").read_text())


class Launch:
    """`fatpipe launch <cluster> <args>` running in the background, and its run folder.

    `timeout_s` bounds a stall, not the run: a loaded machine (`make test-loaded`) stretches a run
    that still advances, so finish() waits while the launch prints or a node logs a step, and fails
    once neither happened for `timeout_s`. The launch's own --timeout, HANG_FACTOR times that, only
    ends a run the test lost."""

    def __init__(self, folder: Path, cluster: str, args: list[str], timeout_s: float,
                 env: dict[str, str] | None = None):
        self.log, self.timeout_s = folder / "launch.out", timeout_s
        runs = folder / ".fatpipe" / cluster / "runs"
        before = set(runs.iterdir()) if runs.is_dir() else set()
        with open(self.log, "w") as out:
            # A session of its own: stop() signals it as Ctrl-C would, and fatpipe stops the nodes.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fatpipe.cli", "launch", cluster, *args,
                 "--timeout", str(timeout_s * HANG_FACTOR)],
                cwd=folder, env=cli_env(**(env or {})), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            self.run_dir = wait_for("the run folder", lambda: self._run(runs, before), 60)
        except BaseException:
            self.stop()
            raise

    def _run(self, runs: Path, before: set[Path]) -> Path | None:
        """This launch's run folder: the new one, once its rendezvous is written."""
        if self.proc.poll() is not None:
            raise AssertionError(f"launch ended early:\n{self.output()}")
        new = [p for p in runs.glob("2*") if p not in before and (p / "rendezvous.json").exists()]
        return new[0] if len(new) == 1 else None

    def output(self, tail: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def metrics(self) -> list[dict]:
        """The run's steps, each as recorded last (a resumed attempt writes some again)."""
        return read_metrics(self.run_dir / "metrics.jsonl")

    def steps_logged(self) -> int:
        return len(self.metrics())

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def wait_steps(self, steps: int, timeout_s: float = 150, checkpoint: bool = False) -> int:
        """Wait until `steps` steps are logged (and a checkpoint exists, if asked); the count."""
        def ready() -> int:
            if self.proc.poll() is not None:
                raise AssertionError(f"launch ended before the fault:\n{self.output()}")
            logged = self.steps_logged()
            ckpt = not checkpoint or any((self.run_dir / "checkpoints").glob("step-*.pt"))
            return logged if ckpt and logged >= steps else 0

        return wait_for(f"{steps} steps", ready, timeout_s, every_s=0.05)

    def progress(self) -> tuple[int, int]:
        """What grows while the run advances: the launch's output and every node's metrics."""
        return size(self.log), sum(size(p) for p in self.run_dir.rglob("metrics.jsonl"))

    def finish(self) -> int:
        """Wait for the launch to end while it makes progress; its exit status. Stopped, and
        AssertionError, after `timeout_s` without any."""
        mark, since = self.progress(), time.monotonic()
        while True:
            try:
                return self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
            now = self.progress()
            if now != mark:
                mark, since = now, time.monotonic()
            elif time.monotonic() - since > self.timeout_s:
                self.stop()
                raise AssertionError(f"the launch made no progress for {self.timeout_s:g} s:\n{self.output()}")

    def stop(self) -> None:
        """Ctrl-C: fatpipe stops every node; then whatever is left of the launch is killed."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def inject(self, fault: Callable[[], object], after_steps: int, checkpoint: bool = False) -> int:
        """Run `fault()` once `after_steps` steps are logged, then wait for the end; returns the
        launch's exit status. Stops the launch if anything fails."""
        try:
            self.wait_steps(after_steps, checkpoint=checkpoint)
            fault()
            return self.finish()
        except BaseException:
            self.stop()
            raise

    def node_log(self, rank: int) -> str:
        return (self.run_dir / f"node-{rank}.log").read_text(errors="replace")


def deployed_sim_cluster(tmp_path_factory, name: str, octet: int, nodes: int = 3):
    """The body of a module fixture (`yield from` it): a deployed netns sim cluster's folder,
    destroyed afterwards; skipped (failed in CI) without namespaces or terraform."""
    import shutil

    from conftest import netns_available, skip_or_fail

    if not netns_available():
        skip_or_fail("needs root and `ip netns`")
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform on PATH")
    with sim_cluster(tmp_path_factory.mktemp(name), name, octet, nodes) as folder:
        yield folder


def finish_torchrun(proc: subprocess.Popen, timeout_s: float) -> str:
    """The output of a torchrun that must finish with 0 within `timeout_s`; its tree is killed
    and the test fails otherwise."""
    import pytest

    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout_s}s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
    return output


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process and everything it started."""
    import psutil

    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
