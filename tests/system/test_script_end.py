"""A user's script ends under trainer.api.userscript as it ended under Python, never in an abort
from gloo's thread (trainer.exiting).

Two real gloo processes over loopback. Rank 0's script leaves a collective whose completion
callback (a Python function, as every DDP comm hook written in Python has) runs on gloo's thread
only after the script has ended: rank 1 joins it 6 s later. Under plain Python that thread asks
for the GIL while the interpreter finalizes and the process aborts ("terminate called without an
active exception", exit -6), which on a loaded machine happens after a finished run. Under the
wrapper the script's threads are joined and its atexit handlers run, as Python would, and the
process ends with the script's own status.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fatpipe.ops.rdzv.nodefiles import USER_SCRIPT_MODULE

from .conftest import free_port

pytestmark = pytest.mark.timeout(300)

JOB = """\
import atexit, sys, threading, time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
if dist.get_rank() == 0:
    pending = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value())
    threading.Thread(target=lambda: (time.sleep(1), print("thread joined", flush=True))).start()
    atexit.register(lambda: print("atexit ran", flush=True))
    if sys.argv[1:] == ["raise"]:
        raise ValueError("the script failed")
    sys.exit(int(sys.argv[1]))
time.sleep(6)
try:
    dist.all_reduce(t)
except RuntimeError:
    pass
"""


def run_pair(tmp_path, *launcher: str, arg: str) -> subprocess.CompletedProcess:
    """Rank 0 as `launcher job.py arg` (its result), rank 1 beside it."""
    (tmp_path / "job.py").write_text(JOB)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    peer = subprocess.Popen([sys.executable, "job.py", "0"], cwd=tmp_path, env={**env, "RANK": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return subprocess.run([sys.executable, *launcher, "job.py", arg], cwd=tmp_path, env={**env, "RANK": "0"},
                              text=True, capture_output=True, timeout=120)
    finally:
        peer.wait(timeout=120)


def test_plain_python_aborts_here_which_is_what_the_wrapper_prevents(tmp_path):
    done = run_pair(tmp_path, arg="0")
    assert done.returncode == -6 and "terminate called without an active exception" in done.stderr, done


@pytest.mark.parametrize("arg, status", [("0", 0), ("3", 3), ("raise", 1)])
def test_the_wrapper_ends_a_script_with_its_own_status_after_its_threads_and_atexit(tmp_path, arg, status):
    done = run_pair(tmp_path, "-m", USER_SCRIPT_MODULE, arg=arg)
    assert done.returncode == status, done
    assert "terminate called" not in done.stderr, done.stderr
    assert done.stdout.splitlines() == ["thread joined", "atexit ran"], done
    assert ("ValueError: the script failed" in done.stderr) == (arg == "raise"), done.stderr
