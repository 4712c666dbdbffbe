"""The order in which node venvs are built from one download (ops/env/venvs.py): node 0 downloads,
serves, and then installs its own venv at the same time as the other nodes install theirs, so
its install is no longer a wait the others sit through (bench/first_step.py measured it)."""

from __future__ import annotations

import threading

import pytest

from fatpipe.infra.nodevenv import NodeVenv
from fatpipe.ops.env.venvs import build_node_envs
from fatpipe.ops.rdzv.noderun import NodeRun
from fatpipe.ops.rdzv.rendezvous import NodePlan, Rendezvous
from fatpipe.ops.reach.transport import Result, Transport

pytestmark = pytest.mark.timeout(120)
NODES = 4


class Node(Transport):
    """A node whose commands are recorded; an install waits until every node is installing."""

    def __init__(self, name: str, installing: threading.Barrier, calls: list):
        super().__init__(name)
        self.installing, self.calls = installing, calls

    def run(self, command: str, timeout: float | None = 60, stdin_text: str | None = None) -> Result:
        kind = ("install" if "pip install" in command else "download" if "pip download" in command
                else "serve" if "http.server" in command else "stop" if "kill --" in command
                else "check")
        self.calls.append((self.node_name, kind))
        if kind == "install":
            self.installing.wait()  # breaks, and raises, when a node installs alone
        if kind == "serve":
            return Result(0, "pid 4242\nServing HTTP on 10.0.0.10 port 8123\n", "")
        return Result(1 if kind == "check" else 0, "", "")  # every venv stale


def cluster(installing: threading.Barrier, calls: list) -> list[NodeRun]:
    plans = [NodePlan(rank=i, name=f"n-{i}", transport="ssh", private_ip=f"10.0.0.{10 + i}",
                      public_ip=None, netns=None, workdir="fatpipe", python=".fatpipe/venv/bin/python")
             for i in range(NODES)]
    rdzv = Rendezvous(run_id="r1", cluster="c", provider="ssh", nnodes=NODES, nproc_per_node=1,
                      rdzv_backend="c10d", rdzv_endpoint="10.0.0.10:1", max_restarts=0,
                      join_timeout_s=10, run_rel="runs/r1", entry=[], builtin_trainer=False,
                      tier_gbps=1, created="", nodes=plans)
    return [NodeRun(rdzv, plan, Node(plan.name, installing, calls)) for plan in plans]


def test_node_0_installs_its_venv_while_the_others_install_theirs():
    calls, lines = [], []
    installing = threading.Barrier(NODES, timeout=30)
    build_node_envs(cluster(installing, calls), NodeVenv("torch==2.13.0", ""), "abc", lines.append)
    node_0 = [kind for name, kind in calls if name == "n-0" and kind != "check"]
    assert node_0 == ["download", "serve", "install", "stop"]
    assert sorted(name for name, kind in calls if kind == "install") == [f"n-{i}" for i in range(NODES)]
    assert "venv built from n-0's wheels over the private links" in lines[-1]
