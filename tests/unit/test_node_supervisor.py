"""The node's supervisor (node/supervisor.py), run for real as on a node: its death leaves the
node's end readable from the trainer's keeper, no value of the run's becomes shell text, a
torchrun that handled a signal ends by it (that node programs are standard-library Python 3.8:
test_architecture.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fatpipe.node import runproc
from fatpipe.ops.rdzv.nodefiles import node_script_text
from fatpipe.ops.rdzv.noderun import SUPERVISOR, NodeRun
from fatpipe.ops.run.launch import stop_nodes

from .test_noderun_restart import alive, node, run_to_end

pytestmark = pytest.mark.timeout(120)

# The attempt waits for a `go` file, then ends with status 3.
WAITS = 'while [ ! -e go ]; do sleep 0.05; done\nexit 3'


def wait_for(what: str, check, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def files(n: NodeRun) -> Path:
    return Path(n.plan.workdir) / n.rdzv.run_rel / f"node-{n.plan.rank}"


def started_then_orphaned(n: NodeRun, start: bool = True) -> int:
    """Start the node's supervisor (unless started), wait for its attempt, kill the supervisor
    alone (kill -9 of the pid it recorded); returns its keeper's pid."""
    assert not start or n.transport.run(n.start_command()).ok
    wait_for("the attempt", lambda: (Path(n.plan.workdir) / "attempts.txt").exists())
    supervisor = int(files(n).with_suffix(".pid").read_text())
    os.kill(supervisor, signal.SIGKILL)
    wait_for("the supervisor to go", lambda: not alive(supervisor))
    keeper = runproc.Keeper(str(files(n).with_suffix(".keeper")))
    assert keeper.alive() and keeper.status is None
    return keeper.pid


def test_the_supervisors_death_leaves_the_nodes_end_readable(tmp_path):
    n = node(tmp_path, WAITS)
    keeper = started_then_orphaned(n)
    # The trainer goes on: the node runs, and a follower waits on the keeper.
    assert n.status() == "running"
    pid_files = [str(files(n).with_suffix(s)) for s in (".pid", ".ident", ".keeper")]
    assert runproc.wrapper_pid(*pid_files) == str(keeper)
    (tmp_path / "go").touch()
    state, log = run_to_end(n, start=False)
    assert state == "3", log
    assert files(n).with_suffix(".exit").read_text().strip() == "3"  # what `runs` and a pull read
    assert "the node's supervisor is gone: torchrun's status 3 is the node's end" in log, log
    assert (tmp_path / "attempts.txt").read_text().strip() == "1"


def test_stop_after_the_supervisors_death_stops_the_trainer_and_records_it(tmp_path):
    n = node(tmp_path, 'setsid sleep 300 & echo $! > worker.pid\n' + WAITS)
    keeper = started_then_orphaned(n)
    worker = int(wait_for("the worker", lambda: (tmp_path / "worker.pid").exists()
                          and (tmp_path / "worker.pid").read_text().strip()))
    stop_nodes([n])
    assert n.status() == "143"  # bash ended by the TERM stop sent, as the keeper recorded it
    assert files(n).with_suffix(".stop").exists()
    assert not alive(keeper) and not alive(worker)  # the worker (its tag) went too


def test_no_value_of_the_run_becomes_shell_text(tmp_path):
    # `--remote-python` as the run records it: quotes, a command substitution, a backquote.
    python = f"""{tmp_path}/no such "python" $(touch {tmp_path}/pwned) `touch {tmp_path}/pwned2` '"""
    n = node(tmp_path, 'if [ $n = 1 ]; then kill -KILL $$; fi\nexit 0')
    n.plan = dataclasses.replace(n.plan, python=python)
    state, log = run_to_end(n)  # the restart's rendezvous step runs that interpreter
    assert state == "0" and "could not prepare the rendezvous for the new torchrun" in log, log
    # node-<rank>.sh takes it as one word, FATPIPE_PYTHON still first.
    text = node_script_text(n.rdzv, dataclasses.replace(n.plan, command=["-m", "x"]))
    line = next(line for line in text.splitlines() if line.startswith("PY="))
    said = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$PY"'], capture_output=True, text=True,
                          env={**os.environ, "FATPIPE_PYTHON": ""}, timeout=10)
    assert said.stdout == python, said
    said = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$PY"'], capture_output=True, text=True,
                          env={**os.environ, "FATPIPE_PYTHON": "/opt/py"}, timeout=10)
    assert said.stdout == "/opt/py"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


# A stand-in for the node's Lighthouse: records its pid, then serves until killed.
LIGHTHOUSE = """import os, time
with open("lighthouses.txt", "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(300)
"""


def lighthouses(folder: Path) -> list[int]:
    found = folder / "lighthouses.txt"
    return [int(p) for p in found.read_text().split()] if found.exists() else []


@pytest.mark.parametrize("case", ["supervised", "orphaned"])
def test_the_lighthouse_is_kept_for_the_run_and_ends_with_it(tmp_path, case):
    # Under live the supervisor keeps the node's Lighthouse beside torchrun: started again a
    # second after it dies, ended with the run; a keeper whose supervisor died ends it too.
    (tmp_path / "lh_standin.py").write_text(LIGHTHOUSE)
    n = node(tmp_path, WAITS)
    settings = {**n.settings(), "lighthouse": ["lh_standin"], "python": sys.executable}
    assert n.transport.run(n.sh(f"python3 -c {shlex.quote(SUPERVISOR)} start "
                                f"{shlex.quote(json.dumps(settings))}")).ok
    first = wait_for("the Lighthouse", lambda: lighthouses(tmp_path))[0]
    if case == "supervised":
        os.kill(first, signal.SIGKILL)
        wait_for("the Lighthouse again", lambda: len(lighthouses(tmp_path)) == 2)
    else:
        started_then_orphaned(n, start=False)
    (tmp_path / "go").touch()
    state, log = run_to_end(n, start=False)
    assert state == "3", log
    wait_for("every Lighthouse to go", lambda: not any(alive(p) for p in lighthouses(tmp_path)), 10)


JOB = """import pathlib, sys, time
pathlib.Path(sys.argv[1]).touch()
time.sleep(300)
"""


def test_a_torchrun_that_handled_a_signal_ends_by_it(tmp_path):
    # The real torchrun through trainer.agent: TERM stops its worker, and its status says TERM.
    (tmp_path / "job.py").write_text(JOB)
    agent = subprocess.Popen(
        [sys.executable, "-m", "fatpipe.trainer.agent", "torch.distributed.run", "--standalone",
         "--nproc-per-node", "1", str(tmp_path / "job.py"), str(tmp_path / "up")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_for("the worker", lambda: (tmp_path / "up").exists() or agent.poll() is not None, 90)
        assert agent.poll() is None, agent.stdout.read().decode()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == -signal.SIGTERM, agent.stdout.read().decode()
        assert "got signal" not in agent.stdout.read().decode()  # no traceback from the handled signal
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
