"""The operator's connection is a view of a run, never its lifeline; a failed run names what
happened. A 2-node sim cluster reached over SSH (an sshd in each node's namespace), deployed once.

- The follower's ssh of a node killed mid-run, then the operator's packets to that node dropped
  inside it for longer than ssh's keep-alive gives up (4 s x 4 here, FATPIPE_SSH_ALIVE_S; 15 s x 4
  by default): the run finishes, exit 0,
  and every line of every node's log is printed exactly once.
- `up --down-after` past `--unreachable-timeout`: exit 75 and one line, nothing stopped, the
  cluster left up; `fatpipe logs -f` reattaches once the node answers and sees the run end.
- Every process of one node's run killed at once (its sshd lives on): that node is named as
  lost with the run's last step; the node fatpipe stopped after it is not; the summary shows
  the steps the run recorded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import faults
import psutil
import pytest

from fatpipe.ops.reach.keepalive import ALIVE_COUNT

from .conftest import require_ssh_sim, ssh_sim_toml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

NAME, OCTET, NODES = "fw-view", 200, 2
OPERATOR = f"10.{OCTET}.0.1"  # this machine's address on the cluster's bridge (stacks.sim.sshd)
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-fw-")
TRAIN = ["--max-restarts", "0", "--remote-python", sys.executable, "--preset", "tiny", "--batch-size", "2",
         "--seq-len", "32", "--comm", "none", "--warmup-steps", "1"]
ALIVE_S = 4  # FATPIPE_SSH_ALIVE_S: the partition outlasts ssh's keep-alive sooner than by default
KEEPALIVE_GIVES_UP_S = ALIVE_S * ALIVE_COUNT  # ops.reach.keepalive: ServerAliveInterval x ServerAliveCountMax


def env() -> dict[str, str]:
    return faults.cli_env(FATPIPE_SSH_CONTROL_DIR=CONTROL_DIR, COLUMNS="250", FATPIPE_SSH_ALIVE_S=str(ALIVE_S))


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("follow")
    (folder / "fatpipe.toml").write_text(ssh_sim_toml(NAME, NODES, OCTET))
    try:
        deployed = fatpipe(folder, "deploy", NAME, "--yes")
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        yield folder
    finally:
        for i in range(NODES):
            heal(i)
        fatpipe(folder, "down", NAME, timeout=300)
        from fatpipe.stacks.sim import net as simnet

        simnet.sweep_cluster(NAME, folder / ".fatpipe" / NAME / "nodes")


class Background:
    """A fatpipe command running in a session of its own, its output in a file."""

    def __init__(self, folder: Path, *args: str):
        self.folder, self.out = folder, folder / f"{args[0]}.out"
        runs = folder / ".fatpipe" / NAME / "runs"
        self.before = set(runs.glob("2*")) if runs.is_dir() else set()
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env(),
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def run_id(self) -> str:
        def new() -> str | None:
            assert self.proc.poll() is None, self.output()[-4000:]
            made = [p for p in (self.folder / ".fatpipe" / NAME / "runs").glob("2*")
                    if p not in self.before and (p / "rendezvous.json").exists()]
            return made[0].name if len(made) == 1 else None

        return faults.wait_for("the run's folder", new, 240)

    def wait_steps(self, steps: int, timeout_s: float = 300) -> int:
        """Wait until node 0 has recorded `steps` steps of this run; the count."""
        def recorded() -> int:
            assert self.proc.poll() is None, self.output()[-4000:]
            metrics = on_node(self.folder, 0, self.run_id()) / "metrics.jsonl"
            count = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            return count if count >= steps else 0

        return faults.wait_for(f"{steps} steps", recorded, timeout_s, every_s=0.2)

    def finish(self, timeout_s: float = 600) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.interrupt()
            raise

    def interrupt(self) -> None:
        """Ctrl-C if it still runs; then no run of this test is left on the nodes for the next."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        fatpipe(self.folder, "stop", NAME, timeout=300)


def on_node(folder: Path, index: int, run_id: str) -> Path:
    """The run's folder on node `index` (a sim node's project folder lies on this machine)."""
    outputs = json.loads((folder / ".fatpipe" / NAME / "outputs.json").read_text())
    return Path(outputs["nodes"][index]["remote_dir"]) / ".fatpipe" / NAME / "runs" / run_id


def netns(index: int) -> str:
    return faults.netns_name(NAME, index)


def partition(index: int) -> None:
    """Drop every packet between this machine and the node, inside the node (its peers still reach it)."""
    rules = (f"add table inet fwtest\nadd chain inet fwtest input {{ type filter hook input priority -50; }}\n"
             f"add rule inet fwtest input ip saddr {OPERATOR} drop\n"
             f"add chain inet fwtest output {{ type filter hook output priority -50; }}\n"
             f"add rule inet fwtest output ip daddr {OPERATOR} drop\n")
    done = subprocess.run(["ip", "netns", "exec", netns(index), "nft", "-f", "-"], input=rules, text=True,
                          capture_output=True, timeout=10)
    assert done.returncode == 0, done.stderr


def heal(index: int) -> None:
    subprocess.run(["ip", "netns", "exec", netns(index), "nft", "delete", "table", "inet", "fwtest"],
                   capture_output=True, timeout=10)


def ssh_clients(launch: Background, needle: str) -> list[psutil.Process]:
    """The launch's ssh processes whose command holds `needle` (e.g. a node's log stream)."""
    found = []
    for proc in psutil.Process(launch.proc.pid).children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if proc.name() == "ssh" and needle in cmd:
            found.append(proc)
    return found


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def close_masters() -> None:
    """Exit ssh's multiplexing masters of this test (the connections every command shares)."""
    for sock in Path(CONTROL_DIR).glob("*"):
        subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=10)


def node_lines(output: str, index: int) -> list[str]:
    prefix = f"{NAME}-{index} | "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def assert_every_line_once(output: str, folder: Path, run_id: str) -> None:
    """What the follow printed of each node is exactly that node's log: nothing lost, nothing twice."""
    for i in range(NODES):
        log = (on_node(folder, i, run_id) / f"node-{i}.log").read_text(errors="replace").splitlines()
        assert [line.rstrip() for line in node_lines(output, i)] == [line.rstrip() for line in log], (
            f"node {i}:\n" + output[-6000:])
    steps = [line for line in node_lines(output, 0) if re.match(r"step \d+/", line)]
    numbers = [int(re.match(r"step (\d+)/", line)[1]) for line in steps]
    assert numbers and numbers == sorted(set(numbers)), numbers


def test_a_killed_follower_and_a_partition_past_the_keepalive_cost_nothing(cluster):
    # -v: every line of every node's log (the terminal otherwise leaves c10d's warnings to the logs)
    launch = Background(cluster, "launch", NAME, "-v", *TRAIN, "--steps", "120", "--timeout", "900")
    try:
        run_id = launch.run_id()
        launch.wait_steps(5)
        for node in (0, 1, 0):  # the followers' ssh killed, node 0's twice
            streams = faults.wait_for(f"node {node}'s log stream",
                                      lambda n=node: ssh_clients(launch, f"node-{n}.log"), 60)
            for proc in streams:
                proc.kill()
            time.sleep(2)
        launch.wait_steps(40)
        held = faults.wait_for("node 0's log stream", lambda: ssh_clients(launch, "node-0.log"), 60)
        partition(0)
        try:
            # Past the keepalive, until ssh gave the connection up: the streams that held it ended.
            time.sleep(KEEPALIVE_GIVES_UP_S)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(alive(p) for p in held):
                time.sleep(0.5)
            assert launch.proc.poll() is None, launch.output()[-4000:]
        finally:
            heal(0)
        code = launch.finish()
    finally:
        launch.interrupt()
    output = launch.output()
    assert code == 0, output[-6000:]
    assert_every_line_once(output, cluster, run_id)
    assert "step 120/120" in output, output[-4000:]
    local = cluster / ".fatpipe" / NAME / "runs" / run_id
    assert (local / "node-0.exit").read_text().strip() == "0"  # pulled once it answered again
    assert not list(local.glob("node-*.stop")), "a node was stopped"


def test_up_gives_up_following_past_the_bound_and_leaves_the_run_and_the_cluster(cluster):
    up = Background(cluster, "up", NAME, "--netcheck", "off", "--down-after", "--unreachable-timeout", "20",
                    *TRAIN, "--steps", "300")
    try:
        run_id = up.run_id()
        up.wait_steps(5)
        partition(1)
        try:
            close_masters()  # the open connections go at once; new ones cannot be made
            code = up.finish(timeout_s=300)
        finally:
            heal(1)
    except BaseException:
        up.interrupt()
        raise
    output = up.output()
    assert code == 75, output[-6000:]
    flat = " ".join(output.split())
    assert (f"stopped following (exit 75): {NAME}-1 could not be reached; run {run_id} goes on on its nodes: "
            f"`fatpipe logs {NAME} -f` reattaches") in flat, output[-4000:]
    assert f"`fatpipe down {NAME}` destroys it" in flat, output[-4000:]
    assert "Destruction complete" not in output and (cluster / ".fatpipe" / NAME / "outputs.json").exists()
    assert all(faults.netns_pids(netns(i)) for i in range(NODES))  # the nodes are still there
    assert not list(on_node(cluster, 1, run_id).glob("node-*.stop")), "the run was stopped"
    # Reattach: the run goes on to its end, which the follow reads from what the nodes wrote.
    logs = fatpipe(cluster, "logs", NAME, "-f", timeout=600)
    assert logs.returncode == 0, logs.stdout[-6000:]
    assert "step 300/300" in logs.stdout
    assert (on_node(cluster, 1, run_id) / "node-1.exit").read_text().strip() == "0"


def test_a_node_whose_processes_vanished_is_named_lost_with_its_last_step(cluster):
    up = Background(cluster, "up", NAME, "--netcheck", "off", *TRAIN, "--steps", "100000")
    try:
        run_id = up.run_id()
        seen = up.wait_steps(30)
        folder = on_node(cluster, 1, run_id)
        wrapper = int((folder / "node-1.pid").read_text())
        run = [p for p in faults.netns_pids(netns(1)) if p != wrapper and "sshd" not in " ".join(faults.cmdline(p))]
        for pid in [wrapper, *run]:  # the wrapper first: it has no chance to record an exit status
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        code = up.finish(timeout_s=300)
    finally:
        up.interrupt()
    output = up.output()
    assert code != 0, output[-6000:]
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output[-6000:]
    m = re.match(rf"error: {NAME}-1 was lost after step (\d+): its processes vanished", errors[0])
    assert m and int(m[1]) >= seen, errors[0]
    assert f"{NAME}-0 failed first" not in output and "got signal: 15" not in errors[0], errors[0]
    assert "no steps recorded" not in output, output[-4000:]
    steps = re.search(r"steps\s+│?\s*(\d+)", output)
    assert steps and int(steps[1]) >= seen, output[-4000:]
