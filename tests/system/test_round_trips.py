"""Every command that touches nodes makes at most one round trip to each node for its checks,
plus the transfers it needs (issue 35, item 1): counted on a 2-node sim cluster reached over
SSH, through an `ssh` on PATH that logs each session before it runs the real one.

Per command and node, what is counted is the remote commands for its checks (tests/countingssh.py
says what each session is): not the transfers, not a launch's start of its node process, not the
project push's record of what it sent (written before the copy), not a follower's log stream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import countingssh
import pytest

from .conftest import require_ssh_sim, ssh_sim_toml

pytestmark = pytest.mark.slow

CLUSTER, OCTET, NODES = "t-nc-rt", 231, 2
FOLLOWED = {"netcheck"}  # commands that follow a run on the nodes to its end
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-nc-")
JOB = """\
import pathlib, time
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/result.txt").write_text("done\\n")
print("result written", flush=True)
time.sleep(120)
"""
class Counted:
    """`fatpipe` commands in one project folder, whose ssh sessions are logged (tests/countingssh.py)."""

    def __init__(self, folder: Path):
        self.folder, self.counting = folder, countingssh.install(folder / "counting-bin")

    def run(self, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, Counter]:
        """Run `fatpipe ARGS`; (its result, {(host, kind): sessions})."""
        countingssh.sessions(self.counting)
        env = {**os.environ, **self.counting, "COLUMNS": "200", "FATPIPE_SSH_CONTROL_DIR": CONTROL_DIR,
               "PATH": f"{self.counting['PREPEND_PATH']}:{os.environ['PATH']}"}
        for name in ("FATPIPE_CONFIG", "FATPIPE_REMOTE_DIR"):
            env.pop(name, None)
        done = subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=self.folder, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return done, countingssh.sessions(self.counting)


def on_node(folder: Path, index: int, rel: str) -> Path:
    """A path in the node's project folder (a sim node's folder lies on this machine)."""
    outputs = json.loads((folder / ".fatpipe" / CLUSTER / "outputs.json").read_text())
    return Path(outputs["nodes"][index]["remote_dir"]) / rel


def checks(sessions: Counter) -> dict[str, int]:
    """{host: check round trips} of one command."""
    found: dict[str, int] = {}
    for (host, kind), n in sessions.items():
        if kind == "check":
            found[host] = found.get(host, 0) + n
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("roundtrips")
    (folder / "fatpipe.toml").write_text(ssh_sim_toml(CLUSTER, NODES, OCTET))
    (folder / ".gitignore").write_text("counting-bin/\ngot/\n")
    (folder / "job.py").write_text(JOB)
    counted = Counted(folder)
    try:
        deployed, _ = counted.run("deploy", CLUSTER)
        assert deployed.returncode == 0, deployed.stdout
        yield counted
    finally:
        down, sessions = counted.run("down", CLUSTER, timeout=300)
        assert down.returncode == 0, down.stdout


def test_each_command_makes_at_most_one_check_round_trip_per_node(cluster):
    per_command = {}
    for args in (("wait", CLUSTER),
                 ("netcheck", CLUSTER, "--quick", "--no-gate", "--remote-python", sys.executable),
                 ("launch", CLUSTER, "--detach", "--max-restarts", "0", "--remote-python", sys.executable,
                  "--", "job.py"),
                 ("status", CLUSTER),
                 ("logs", CLUSTER),
                 ("pull", CLUSTER, "out/result.txt", "job.py", "--to", "got"),  # two paths, one call
                 ("stop", CLUSTER)):
        if args[0] == "pull":  # once the job wrote it (its start imports torch: seconds on a loaded machine)
            written = on_node(cluster.folder, 0, "out/result.txt")
            deadline = time.monotonic() + 300
            while not written.exists() and time.monotonic() < deadline:
                time.sleep(1)
        done, sessions = cluster.run(*args)
        assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}"
        per_command[args[0]] = checks(sessions)
        print(args[0], dict(sessions))
    assert all(len(hosts) >= 1 for name, hosts in per_command.items() if name != "pull"), per_command
    # A command that follows its run to the end (netcheck) reads each node's end once more: the
    # run's state and the rest of its log, in one call after the log stream.
    over = {name: hosts for name, hosts in per_command.items()
            if any(n > 1 + (name in FOLLOWED) for n in hosts.values())}
    assert not over, f"more than one check round trip to a node: {over}"


def test_a_second_launch_with_nothing_changed_sends_no_project(cluster):
    """A warm launch: the node holds exactly what the project push would send, so neither the
    push's record nor its rsync goes; the run's inputs and the trainer still travel."""
    launch = ("launch", CLUSTER, "--detach", "--max-restarts", "0", "--remote-python", sys.executable, "--", "job.py")
    per_launch = []
    (cluster.folder / "notes.txt").write_text(f"changed at {time.time()}\n")  # the first launch sends it
    for _ in range(2):
        done, sessions = cluster.run(*launch)
        assert done.returncode == 0, done.stdout[-3000:]
        stopped, _ = cluster.run("stop", CLUSTER)
        assert stopped.returncode == 0, stopped.stdout[-3000:]
        per_launch.append((sessions, done.stdout))
        print(dict(sessions))
    (first, _), (second, said) = per_launch

    def total(sessions: Counter, kind: str) -> int:  # rsync's ssh names no host where the log reads it
        return sum(n for (_, k), n in sessions.items() if k == kind)

    assert total(first, "push-record") == NODES, first  # the changed project went, record and copy
    assert total(second, "push-record") == 0, second
    assert total(first, "transfer") == total(second, "transfer") + NODES, (first, second)  # one rsync less a node
    assert said.count("the project folder is in place") == NODES, said[-3000:]
