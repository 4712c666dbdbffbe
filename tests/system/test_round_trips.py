"""Every command that touches nodes makes at most one round trip to each node for its checks,
plus the transfers it needs (issue 35, item 1): counted on a 2-node sim cluster reached over
SSH, through an `ssh` on PATH that logs each session before it runs the real one.

A session is a transfer when it carries rsync's server; the rest are remote commands. Per
command and node, what is counted is the remote commands for its checks: not the transfers, not
a launch's start of its node process, not the project push's record of what it sent (written
before the copy: ops/env/projectsync.py), not a follower's log stream.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from .conftest import require_ssh_sim, ssh_sim_toml

pytestmark = pytest.mark.slow

CLUSTER, OCTET, NODES = "t-nc-rt", 231, 2
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-nc-")
JOB = """\
import pathlib, time
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/result.txt").write_text("done\\n")
print("result written", flush=True)
time.sleep(120)
"""
# Writes one line per ssh session: the host (the argument after `--`) and what the session is.
COUNTING_SSH = """#!/bin/bash
host=; prev=
for a in "$@"; do [ "$prev" = "--" ] && [ -z "$host" ] && host=$a; prev=$a; done
case "$*" in
  *"rsync --server"*) kind=transfer ;;
  *FATPIPE_NODECALL*) kind=check ;;
  *"' commit "*) kind=push-record ;;
  *"setsid -f"*) kind=start ;;
  *"-F --pid"*) kind=follow ;;
  *) kind=check ;;
esac
printf '%s\\t%s\\n' "${host:-?}" "$kind" >> "$FATPIPE_TEST_SSH_LOG"
exec "$FATPIPE_TEST_REAL_SSH" "$@"
"""


class Counted:
    """`fatpipe` commands in one project folder, whose ssh sessions are logged."""

    def __init__(self, folder: Path):
        self.folder, self.log = folder, folder / "ssh-sessions.log"
        self.bin = folder / "counting-bin"
        self.bin.mkdir()
        wrapper = self.bin / "ssh"
        wrapper.write_text(COUNTING_SSH)
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)

    def run(self, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, Counter]:
        """Run `fatpipe ARGS`; (its result, {(host, kind): sessions})."""
        self.log.write_text("")
        env = {**os.environ, "COLUMNS": "200", "FATPIPE_SSH_CONTROL_DIR": CONTROL_DIR,
               "PATH": f"{self.bin}:{os.environ['PATH']}", "FATPIPE_TEST_SSH_LOG": str(self.log),
               "FATPIPE_TEST_REAL_SSH": shutil.which("ssh")}
        for name in ("FATPIPE_CONFIG", "FATPIPE_REMOTE_DIR"):
            env.pop(name, None)
        done = subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=self.folder, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        sessions = Counter(tuple(line.split("\t", 1)) for line in self.log.read_text().splitlines())
        return done, sessions


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
    (folder / ".gitignore").write_text("counting-bin/\nssh-sessions.log\ngot/\n")
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
                 ("launch", CLUSTER, "--detach", "--max-restarts", "0", "--remote-python", sys.executable,
                  "--", "job.py"),
                 ("status", CLUSTER),
                 ("logs", CLUSTER),
                 ("pull", CLUSTER, "out/result.txt", "--to", "got"),
                 ("stop", CLUSTER)):
        done, sessions = cluster.run(*args)
        assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}"
        per_command[args[0]] = checks(sessions)
        print(args[0], dict(sessions))
    assert all(len(hosts) >= 1 for name, hosts in per_command.items() if name != "pull"), per_command
    over = {name: hosts for name, hosts in per_command.items() if any(n > 1 for n in hosts.values())}
    assert not over, f"more than one check round trip to a node: {over}"
