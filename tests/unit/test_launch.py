"""The launch path's pieces without torch: detached start, status, stop of a whole tree, venv reuse."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fatpipe.infra.nodevenv import NodeVenv, venv_stamp
from fatpipe.ops.env.venvs import fetch_command, peer_command
from fatpipe.ops.rdzv.noderun import STOP_WAIT_S, LaunchResult, NodeRun, worst_status
from fatpipe.ops.rdzv.rendezvous import NodePlan, Rendezvous
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.reach.transport import LocalTransport
from fatpipe.ops.run.launch import follow_nodes, stop_nodes


def fake_run(folder: Path, scripts: list[str]) -> list[NodeRun]:
    """A run whose node-<rank>.sh are the given bash scripts, on local "nodes" in `folder`."""
    run_rel = "runs/r1"
    (folder / run_rel).mkdir(parents=True)
    plans = [NodePlan(rank=i, name=f"n{i}", transport="local", private_ip=f"127.0.0.{10 + i}",
                      public_ip=None, netns=None, workdir=str(folder), python="python3")
             for i in range(len(scripts))]
    rdzv = Rendezvous(run_id="r1", cluster="c", provider="sim", nnodes=len(scripts), nproc_per_node=1,
                      rdzv_backend="c10d", rdzv_endpoint="127.0.0.10:1", max_restarts=0, join_timeout_s=10,
                      run_rel=run_rel, entry=[], builtin_trainer=False, tier_gbps=1, created="", nodes=plans)
    for i, script in enumerate(scripts):
        (folder / run_rel / f"node-{i}.sh").write_text(script)
    return [NodeRun(rdzv, plan, LocalTransport(plan.name)) for plan in plans]


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][:1] != "Z"


def test_start_follow_and_exit_codes(tmp_path):
    nodes = fake_run(tmp_path, ["echo one; echo two; exit 0", "echo bad >&2; exit 5"])
    for node in nodes:
        assert node.status() == "not-started"
        assert node.transport.run(node.start_command()).ok
    lines: list[tuple[str, str]] = []
    codes = follow_nodes(nodes, lambda n, line: lines.append((n, line)), timeout_s=30)
    assert codes == {"n0": 0, "n1": 5}
    assert ("n0", "one") in lines and ("n0", "two") in lines and ("n1", "bad") in lines
    assert [n.status() for n in nodes] == ["0", "5"]


def test_stop_kills_the_tree_even_outside_the_group(tmp_path):
    # Like torchrun's workers, the grandchild runs in a session of its own; TERM to the group
    # misses it, the stop finds it by parentage.
    script = "setsid sleep 300 & echo $! > child.pid; sleep 300\n"
    (node,) = fake_run(tmp_path, [script])
    assert node.transport.run(node.start_command()).ok
    deadline = time.monotonic() + 10
    while not (tmp_path / "child.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int((tmp_path / "child.pid").read_text())
    group = int((tmp_path / "runs/r1/node-0.pid").read_text())
    assert node.status() == "running" and alive(child)
    started = time.monotonic()
    stop_nodes([node])
    # The wrapper recorded its status once TERM ended the script: no TERM-to-KILL grace waited out.
    assert time.monotonic() - started < STOP_WAIT_S
    assert not alive(child) and not alive(group)
    assert node.exit_code() not in (None, 0)


def test_worst_status_prefers_the_cause():
    assert worst_status([0, 0]) == 0
    assert worst_status([0, 1, 137]) == 137
    assert worst_status([0, None]) == 255
    result = LaunchResult("r", Path("."), {"a": 137, "b": 1}, stopped=["a"])
    assert result.exit_code == 1  # a was stopped by fatpipe after b failed
    assert LaunchResult("r", Path("."), {"a": 0}, interrupted=True).exit_code == 130


def test_a_live_run_rides_out_lost_and_killed_nodes_but_not_a_nodes_own_error():
    def live(**codes):
        return LaunchResult("r", Path("."), codes, live=True).exit_code

    assert live(a=0, b=None, c=137) == 0  # lost, and killed after its restarts: ridden out
    assert live(a=0, b=1) == 1  # a node's own error still fails the run
    assert live(a=None, b=137) == 255  # nobody finished it
    assert LaunchResult("r", Path("."), {"a": 0, "b": None}).exit_code == 255  # restart: lost


def test_venv_is_reused_while_its_inputs_stay_the_same(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    venv = NodeVenv("torch==2.13.0", "https://download.pytorch.org/whl/cpu")
    stamp = venv_stamp(tmp_path, venv)
    assert stamp == venv_stamp(tmp_path, venv)
    assert stamp != venv_stamp(tmp_path, NodeVenv("torch==2.12.0", venv.index))
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    assert stamp != venv_stamp(tmp_path, venv)

    # With a matching stamp the peer's command returns at once: nothing is built or downloaded.
    (tmp_path / ".fatpipe/venv").mkdir(parents=True)
    (tmp_path / ".fatpipe/venv/.fatpipe-stamp").write_text(stamp + "\n")
    command = peer_command(stamp, venv, "http://10.0.0.10:1/")
    done = LocalTransport("n").run(f"cd {tmp_path} && PATH=/nonexistent; {command}", timeout=10)
    assert done.ok, done.stderr
    assert os.listdir(tmp_path / ".fatpipe/venv") == [".fatpipe-stamp"]
    # Node 0 with its venv and a complete wheel folder: nothing either.
    (tmp_path / ".fatpipe/wheels" / stamp).mkdir(parents=True)
    (tmp_path / ".fatpipe/wheels" / stamp / ".complete").write_text("")
    done = LocalTransport("n").run(f"cd {tmp_path} && PATH=/nonexistent; {fetch_command(stamp, venv)}", timeout=10)
    assert done.ok, done.stderr
    assert os.listdir(tmp_path / ".fatpipe/venv") == [".fatpipe-stamp"]


def test_stop_and_status_commands(run_cli, project_dir):
    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.infra.project import load_project
    from fatpipe.infra.runs import new_run
    from fatpipe.ops.rdzv.noderun import node_runs
    from fatpipe.ops.rdzv.rendezvous import new_rendezvous

    project = load_project()
    outputs = parse_outputs({
        "name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
        "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local"}
                  for i in range(2)],
    })
    run_id, run_dir = new_run(project, "demo")
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir)
    nodes = node_runs(rdzv, Cluster.resolve(project, "demo"))
    for node in nodes:  # stand-ins for torchrun: the commands around it are what is tested
        (run_dir / f"node-{node.plan.rank}.sh").write_text("echo started; sleep 300\n")
        assert node.transport.run(node.start_command()).ok
    assert "run " + run_id in run_cli("status").output
    assert all(n.status() == "running" for n in nodes)
    result = run_cli("stop")
    assert result.exit_code == 0 and f"run {run_id} stopped" in result.output
    assert [n.status() for n in nodes] == ["143", "143"]  # bash killed by SIGTERM
    logs = run_cli("logs", "--node", "demo-1")
    assert logs.output.splitlines() == ["demo-1 | started"]
