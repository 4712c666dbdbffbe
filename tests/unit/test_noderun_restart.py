"""The node's supervisor restarts a torchrun that a signal killed, and only that, read from its exit
status: stand-in scripts, no torch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fatpipe.ops.rdzv.noderun import NodeRun
from fatpipe.ops.rdzv.rendezvous import NodePlan, Rendezvous
from fatpipe.ops.reach.transport import LocalTransport
from fatpipe.ops.run.launch import stop_nodes

pytestmark = pytest.mark.timeout(60)

# Counts its attempts in attempts.txt, then does what the test asks of that attempt.
SCRIPT = """n=$(( $(cat attempts.txt 2>/dev/null || echo 0) + 1 )); echo $n > attempts.txt
echo "attempt $n"
{body}
"""


def node(folder: Path, body: str, rank: int = 1, max_restarts: int = 2) -> NodeRun:
    run_rel = "runs/r1"
    (folder / run_rel).mkdir(parents=True, exist_ok=True)
    plan = NodePlan(rank=rank, name=f"n{rank}", transport="local", private_ip="127.0.0.10",
                    public_ip=None, netns=None, workdir=str(folder),
                    python="true")  # the rejoin step before a restart has nothing to reach here
    rdzv = Rendezvous(run_id="r1", cluster="c", provider="sim", nnodes=2, nproc_per_node=1,
                      rdzv_backend="c10d", rdzv_endpoint="127.0.0.10:1",
                      max_restarts=max_restarts, join_timeout_s=10, run_rel=run_rel, entry=[],
                      builtin_trainer=False, tier_gbps=1, created="",
                      nodes=[plan])
    (folder / run_rel / f"node-{rank}.sh").write_text(SCRIPT.format(body=body))
    return NodeRun(rdzv, plan, LocalTransport(plan.name))


def run_to_end(n: NodeRun, timeout_s: float = 30, start: bool = True) -> tuple[str, str]:
    """Start the node's wrapper (unless started), wait for its exit status; returns (status, log)."""
    assert not start or n.transport.run(n.start_command()).ok
    deadline = time.monotonic() + timeout_s
    while (state := n.status()) in ("running", "not-started") and time.monotonic() < deadline:
        time.sleep(0.1)
    log = (Path(n.plan.workdir) / n.rdzv.run_rel / f"node-{n.plan.rank}.log").read_text()
    return state, log


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][:1] != "Z"


def test_a_killed_torchrun_is_started_again_and_its_orphans_go(tmp_path):
    # The first attempt leaves a worker in a session of its own (as torchrun's are), then dies
    # by SIGKILL; the worker must be gone before the second attempt, which succeeds.
    body = """if [ $n = 1 ]; then setsid sleep 300 & echo $! > orphan.pid; sleep 0.5; kill -KILL $$; fi
exit 0"""
    n = node(tmp_path, body)
    state, log = run_to_end(n)
    assert state == "0", log
    assert (tmp_path / "attempts.txt").read_text().strip() == "2"
    assert "ended by signal KILL, not by fatpipe stop: starting it again (restart 1 of 2)" in log
    assert "attempt 1" in log and "attempt 2" in log  # the log is kept across attempts
    assert not alive(int((tmp_path / "orphan.pid").read_text()))


def test_a_signal_restarts_and_words_in_the_log_never_do(tmp_path):
    # torchrun ended by TERM (trainer.agent makes a TERM it handled its end): started again.
    state, log = run_to_end(node(tmp_path / "a", 'if [ $n = 1 ]; then kill -TERM $$; fi\nexit 0'))
    assert state == "0" and "ended by signal TERM, not by fatpipe stop" in log, log
    # torch's words printed by the script itself (or the Lighthouse): it ends with its own status.
    said = 'echo "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15" >&2'
    for folder, status in (("b", 1), ("c", 0)):
        state, log = run_to_end(node(tmp_path / folder, f"{said}\nexit {status}"))
        assert state == str(status) and "starting it again" not in log, log
        assert (tmp_path / folder / "attempts.txt").read_text().strip() == "1"


def test_restarts_are_bounded_and_failures_are_not_restarted(tmp_path):
    state, log = run_to_end(node(tmp_path / "a", "kill -KILL $$", max_restarts=2))
    assert state == "137" and (tmp_path / "a/attempts.txt").read_text().strip() == "3", log
    state, log = run_to_end(node(tmp_path / "b", "echo failed >&2; exit 1"))
    assert state == "1" and "starting it again" not in log
    # Node 0 hosts the rendezvous store: a new torchrun there could not rejoin its peers.
    state, log = run_to_end(node(tmp_path / "c", "kill -KILL $$", rank=0))
    assert state == "137" and "starting it again" not in log


def test_stop_stops_for_good(tmp_path):
    n = node(tmp_path, "sleep 300")
    assert n.transport.run(n.start_command()).ok
    deadline = time.monotonic() + 10
    while not (tmp_path / "attempts.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    stop_nodes([n])
    assert n.status() == "143"  # bash killed by SIGTERM, and not started again
    time.sleep(1.5)
    assert (tmp_path / "attempts.txt").read_text().strip() == "1"
