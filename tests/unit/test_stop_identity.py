"""`status` and `stop` act on the run's own processes only: a pid in node-<rank>.pid that now
names another process (a reboot, a run long gone) reads as lost and is never signalled.

Real wrappers (stand-in scripts, no torch) and real strangers: processes this test starts that
hold the pid file's pid, the run's tag pattern or the recorded start time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fatpipe.node.runproc import AGENT_TAG_ENV, proc_stat
from fatpipe.ops.rdzv.noderun import NodeRun
from fatpipe.ops.run.launch import stop_nodes

from .test_noderun_restart import alive, node

pytestmark = pytest.mark.timeout(90)


def wait_for(what: str, check, timeout_s: float = 20):
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def files(n: NodeRun) -> Path:
    return Path(n.plan.workdir) / n.rdzv.run_rel / f"node-{n.plan.rank}"


def started(n: NodeRun) -> int:
    """Start the node's wrapper; its pid, once its script runs."""
    assert n.transport.run(n.start_command()).ok
    wait_for("the script", lambda: (Path(n.plan.workdir) / "attempts.txt").exists())
    assert n.status() == "running"
    return int(files(n).with_suffix(".pid").read_text())


def gone_without_a_trace(n: NodeRun, wrapper: int) -> None:
    """The wrapper and its group die at once, as in a reboot or an OOM kill: no exit status."""
    os.killpg(wrapper, signal.SIGKILL)
    wait_for("the wrapper to go", lambda: not alive(wrapper))
    assert not files(n).with_suffix(".exit").exists()


@pytest.fixture
def strangers():
    """Start processes that are not the run's (each in a session of its own, as a daemon is,
    with a child); all are ended after the test."""
    procs: list[subprocess.Popen] = []

    def start(**env) -> subprocess.Popen:
        proc = subprocess.Popen(["bash", "-c", "sleep 300 & wait"], start_new_session=True,
                                env={**os.environ, **env})
        procs.append(proc)
        wait_for("the stranger's child", lambda: children(proc.pid))
        return proc

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in found.read_text().split()] if found.exists() else []


def untouched(proc: subprocess.Popen) -> bool:
    return proc.poll() is None and all(alive(c) for c in children(proc.pid)) and children(proc.pid)


def test_a_reused_pid_reads_lost_and_stop_leaves_its_process_alone(tmp_path, strangers):
    n = node(tmp_path, "sleep 300")
    wrapper = started(n)
    gone_without_a_trace(n, wrapper)
    assert n.status() == "lost"
    ident = files(n).with_suffix(".ident").read_text().split()
    # The pid now names a stranger: a group leader with a child, as root's daemons are. Tags
    # another wrapper with this pid would give (another start time; before start times were
    # recorded) mark strangers too.
    stranger = strangers()
    tagged = [strangers(**{AGENT_TAG_ENV: f"fatpipe-{stranger.pid}-{int(ident[1]) + 1}-0"}),
              strangers(**{AGENT_TAG_ENV: f"fatpipe-{stranger.pid}-0"})]
    files(n).with_suffix(".pid").write_text(f"{stranger.pid}\n")
    assert n.status() == "lost"
    # A follower prints the log and ends: it does not wait on the stranger as if it were the run.
    follow = n.transport.run(n.follow_command(follow=True), timeout=20)
    assert follow.ok, follow.reason()
    stop_nodes([n])
    assert untouched(stranger) and all(untouched(t) for t in tagged)
    assert n.status() == "lost" and not files(n).with_suffix(".stop").exists()


def test_another_boot_is_never_this_run_even_at_the_same_start_time(tmp_path, strangers):
    n = node(tmp_path, "sleep 300")
    gone_without_a_trace(n, started(n))
    stranger = strangers()
    start = proc_stat(stranger.pid)[2]
    files(n).with_suffix(".pid").write_text(f"{stranger.pid}\n")
    files(n).with_suffix(".ident").write_text(f"00000000-0000-0000-0000-000000000000 {start}\n")
    assert n.status() == "lost"
    stop_nodes([n])
    assert untouched(stranger)
    # In this boot the same record names it: the check is the start time in this boot.
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    files(n).with_suffix(".ident").write_text(f"{boot} {start}\n")
    assert n.status() == "running"


def test_a_lost_runs_own_orphaned_workers_are_stopped(tmp_path, strangers):
    # The wrapper dies, a worker of its torchrun (a session of its own, the run's tag) lives on:
    # it is this run's, and stop ends it; a stranger with the tag's form but another start
    # time stays.
    n = node(tmp_path, "setsid sleep 300 & echo $! > orphan.pid; sleep 300")
    wrapper = started(n)
    orphan = int(wait_for("the worker", lambda: (tmp_path / "orphan.pid").exists() and
                          (tmp_path / "orphan.pid").read_text().strip()))
    gone_without_a_trace(n, wrapper)
    assert alive(orphan) and n.status() == "lost"
    start = files(n).with_suffix(".ident").read_text().split()[1]
    stranger = strangers(**{AGENT_TAG_ENV: f"fatpipe-{wrapper}-{int(start) + 1}-0"})
    stop_nodes([n])
    assert not alive(orphan) and untouched(stranger)
    assert n.status() == "lost"  # nothing recorded how it ended: stop does not make it up


def test_a_run_from_before_start_times_were_recorded_is_still_stopped(tmp_path, strangers):
    # No .ident: the pid counts only while its process is a wrapper of this pid file.
    n = node(tmp_path, "sleep 300")
    pid_file = files(n).with_suffix(".pid")
    older = subprocess.Popen(  # the older wrapper's start; `true` keeps bash from exec'ing sleep
        ["bash", "-c", f"echo $$ > {pid_file.relative_to(tmp_path)}; trap true TERM; sleep 300; true"],
        cwd=tmp_path, start_new_session=True)
    wait_for("the older wrapper", lambda: pid_file.exists() and pid_file.read_text().strip())
    assert n.status() == "running"
    stop_nodes([n])
    older.wait(timeout=30)
    assert n.status() == "137"
    stranger = strangers()
    pid_file.write_text(f"{stranger.pid}\n")
    files(n).with_suffix(".exit").unlink()
    assert n.status() == "lost"
    stop_nodes([n])
    assert untouched(stranger)
