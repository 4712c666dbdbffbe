"""The node's supervisor is one Python program (issue 35, item 1): no bash loop in the start
command, and the real supervisor, started here as on a node, runs, restarts and records a run."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import time
from pathlib import Path

import pytest

from fatpipe.ops.rdzv.runproc import proc_stat

from .test_noderun_restart import node, run_to_end

pytestmark = pytest.mark.timeout(90)

# Each attempt records its number, its tag and its supervisor's session and stdin, then dies by
# SIGKILL: the supervisor restarts it until max_restarts.
RECORDING = """read -r -a st < /proc/$$/stat
echo "$n $FATPIPE_AGENT ${st[5]} $(readlink /proc/$$/fd/0)" >> attempts.log
kill -KILL $$"""


def test_the_start_command_is_python_and_holds_no_shell_loop(tmp_path):
    words = shlex.split(node(tmp_path, "exit 0").start_command())
    assert words[3:5] == ["python3", "-c"], words[:5]
    shell = " ".join(w for w in words if "\n" not in w)  # the command minus the program itself
    for state_machine in ("while", "setsid -f bash", "trap", "kill -l", "for i in"):
        assert state_machine not in shell, shell
    assert "def supervise(" in words[words.index("-c") + 1]


def test_restarts_record_each_attempt_and_the_final_status(tmp_path):
    n = node(tmp_path, RECORDING, max_restarts=3)
    state, log = run_to_end(n)
    assert state == "137", log
    attempts = [line.split() for line in (tmp_path / "attempts.log").read_text().splitlines()]
    assert [a[0] for a in attempts] == ["1", "2", "3", "4"], attempts
    for restart in (1, 2, 3):
        assert f"ended by signal KILL, not by fatpipe stop: starting it again (restart {restart} of 3)" in log
    files = tmp_path / "runs/r1/node-1"
    pid = int(files.with_suffix(".pid").read_text())
    boot, start = files.with_suffix(".ident").read_text().split()
    assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    # Every attempt's tag: the supervisor's pid and start time and the attempt's number.
    assert [a[1] for a in attempts] == [f"fatpipe-{pid}-{start}-{i}" for i in range(4)]
    # The supervisor led a session of its own (its pid is the group stop signals), stdin closed.
    assert {a[2] for a in attempts} == {str(pid)} and {a[3] for a in attempts} == {"/dev/null"}
    assert not list(files.parent.glob("*.tmp"))


def test_the_supervisor_outlives_the_start_command_and_keeps_an_earlier_log(tmp_path):
    n = node(tmp_path, "sleep 300")
    log = tmp_path / "runs/r1/node-1.log"
    log.write_text("the first start's line\n")
    started = n.transport.run(n.start_command())
    assert started.ok, started.reason()
    pid = int((tmp_path / "runs/r1/node-1.pid").read_text())
    deadline = time.monotonic() + 20
    while not (tmp_path / "attempts.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert n.status() == "running" and proc_stat(pid)[0] not in "ZX"
    assert os.getsid(pid) == pid
    assert "the first start's line" in (tmp_path / "runs/r1/node-1.earlier.log").read_text()
    assert "the first start's line" not in log.read_text()
    assert n.stop_and_status() == "143"


def test_a_rejoin_that_fails_is_said_and_the_restart_goes_on(tmp_path):
    n = node(tmp_path, 'if [ $n = 1 ]; then kill -KILL $$; fi\nexit 0')
    n.plan = dataclasses.replace(n.plan, python="false")
    state, log = run_to_end(n)
    assert state == "0", log
    assert "could not prepare the rendezvous for the new torchrun" in log
    assert re.search(r"attempt 1\n.*restart 1 of 2.*\n.*could not prepare.*\nattempt 2", log, re.S), log
