"""One round trip per node per command (issue 35, item 1), counted on local sim nodes: every
remote command a command runs goes through `Transport.run`, which the test counts per node.

The system test tests/system/test_round_trips.py counts the same over real ssh (launch, pull and
the transfers); here: status, stop and logs through the CLI, a launch's checks of a node with a
project folder of its own, and wait's probe with the firewall's listing.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from fatpipe.ops.reach.transport import LocalTransport, Transport


@pytest.fixture
def counted(monkeypatch):
    """{node: remote commands} of everything run through a Transport from here on."""
    calls: Counter = Counter()
    real = Transport.run

    def run(self, command, timeout=60, stdin_text=None):
        calls[self.node_name] += 1
        return real(self, command, timeout, stdin_text)

    monkeypatch.setattr(Transport, "run", run)
    return calls


def local_cluster(folder: Path, nodes: int = 3) -> None:
    """A deployed sim cluster `demo` of local nodes, booted, with a run made (not started)."""
    outputs = {"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
               "rdzv_port": 29400,
               "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local",
                          "ready_file": str(folder / f"ready-{i}.json")} for i in range(nodes)]}
    for i in range(nodes):
        (folder / f"ready-{i}.json").write_text(json.dumps({"iface": "lo", "mtu": 65536, "namespaced": []}))
    (folder / ".fatpipe" / "demo").mkdir(parents=True)
    (folder / ".fatpipe" / "demo" / "outputs.json").write_text(json.dumps(outputs))
    (folder / "train.py").write_text("print('hi')\n")


def test_status_stop_and_logs_ask_each_node_once(run_cli, project_dir, counted):
    local_cluster(project_dir)
    made = run_cli("rendezvous", "--max-restarts", "0", "--", "train.py")
    assert made.exit_code == 0, made.output
    nodes = {f"demo-{i}" for i in range(3)}
    for args in (("status",), ("stop",), ("logs",)):
        counted.clear()
        done = run_cli(*args)
        assert done.exit_code == 0, f"{args}: {done.output}"
        assert set(counted) <= nodes and max(counted.values(), default=0) <= 1, f"{args}: {dict(counted)}"
        if args[0] != "logs":  # a sim node's log is read here, from the files it shares
            assert set(counted) == nodes, f"{args}: {dict(counted)}"


class HomeNode(LocalTransport):
    """A node whose home is a folder here and whose files are its own (as an ssh node's)."""

    shares_fs = False

    def __init__(self, name: str, home: Path):
        super().__init__(name)
        self.home = home

    def argv(self, command: str) -> list[str]:
        return ["bash", "-c", f"cd {self.home} && {command}"]


def two_home_nodes(tmp_path: Path):
    """Two nodes with homes of their own under `tmp_path` (one run, rendezvous r1), a project, and
    the command's cluster `c`, whose node answers the nodes' transports share."""
    from types import SimpleNamespace

    from fatpipe.ops.rdzv.noderun import NodeRun
    from fatpipe.ops.rdzv.rendezvous import NodePlan, Rendezvous
    from fatpipe.ops.reach.cluster import Cluster

    project_root = tmp_path / "project"
    project_root.mkdir()
    (project_root / "train.py").write_text("print('hi')\n")
    homes = [tmp_path / f"home-{i}" for i in range(2)]
    for home in homes:
        home.mkdir()
    plans = [NodePlan(rank=i, name=f"n{i}", transport="ssh", private_ip=f"10.42.0.{10 + i}", public_ip=None,
                      netns=None, workdir="proj", python=sys.executable) for i in range(2)]
    rdzv = Rendezvous(run_id="r1", cluster="c", provider="ssh", nnodes=2, nproc_per_node=1, rdzv_backend="c10d",
                      rdzv_endpoint="10.42.0.10:1", max_restarts=0, join_timeout_s=10, run_rel=".fatpipe/c/runs/r1",
                      entry=[], builtin_trainer=False, tier_gbps=1, created="", nodes=plans)
    project = type("Project", (), {"root": project_root, "project_id": "0a1b2c3d",
                                   "spec": type("Spec", (), {"run": type("Run", (), {"pull": []})(), "clusters": {}})(),
                                   "state_dir": lambda self, name: tmp_path / "state"})()
    cluster = Cluster(project, SimpleNamespace(name="c"), SimpleNamespace(firewall=None))
    nodes = [NodeRun(rdzv, plan, HomeNode(plan.name, home)) for plan, home in zip(plans, homes, strict=True)]
    for node in nodes:
        node.transport.answers = cluster.answers  # as the cluster's transports have them
    return nodes, cluster


def test_a_launchs_checks_of_a_node_are_one_call(tmp_path, counted, monkeypatch):
    """The run state of the previous run, the folder's claim, the project push's look and the
    versions: one remote command per node, whichever stage reads them."""
    from fatpipe.ops.env.nodeenv import check_node_envs
    from fatpipe.ops.env.projectsync import ProjectPush
    from fatpipe.ops.reach.projectdir import claim_project_dir
    from fatpipe.ops.run import checks
    from fatpipe.ops.run.guard import run_going
    from fatpipe.ops.run.prepare import push_excludes, pushed_folders

    nodes, cluster = two_home_nodes(tmp_path)
    project_root = cluster.project.root
    # No firewall is asked for (the cluster's outputs say none): on this machine it would refuse
    # the claim (the listing travels in the same call: test_claim_behind_firewall.py, tests/system/test_firewall.py).
    monkeypatch.setattr("fatpipe.ops.run.prepare.data_excludes", lambda *args: ())
    try:
        checks.ask_launch_checks(cluster, nodes, previous=nodes)
        assert run_going(cluster, nodes) is None
        for node in nodes:
            assert claim_project_dir(node.transport, "proj", "c", "0a1b2c3d", pushed_folders(node)) == "made"
            ProjectPush(node.transport, project_root, "proj", push_excludes(cluster, node), made=True).look(
                ["train.py"])
        check_node_envs(nodes, tmp_path / "run")
    finally:
        cluster.answers.forget_all()
    assert dict(counted) == {"n0": 1, "n1": 1}
    assert all((tmp_path / f"home-{i}" / "proj" / ".fatpipe/c/runs/r1").is_dir() for i in range(2))  # with the claim


def test_the_node_programs_names_are_the_models():
    """node/callsteps.py is sent alone (standard library only): its marker name is infra's."""
    from fatpipe.infra.node import PROJECT_MARKER
    from fatpipe.node import callsteps

    assert callsteps.PROJECT_MARKER == PROJECT_MARKER


def test_a_failing_step_is_its_own_answer_and_the_others_still_run(tmp_path):
    from fatpipe.ops.reach.asknode import Step, ask
    from fatpipe.ops.reach.projectdir import NODE_CHECKS

    (tmp_path / "f.txt").write_text("first line\nsecond\n")
    answers = ask(LocalTransport("n"), [Step("read_line", ("f.txt",), str(tmp_path)),
                                        Step("callsteps.claim", ("x", "c", "p"), str(tmp_path / "absent"),
                                             NODE_CHECKS),
                                        Step("read_from", ("f.txt", 6), str(tmp_path))])
    assert answers[0] == {"ok": "first line"} and answers[2] == {"ok": "line\nsecond\n"}
    assert answers[1]["error"].startswith("FileNotFoundError")


def test_wait_reads_the_marker_below_the_nodes_own_root(tmp_path, monkeypatch):
    """A sim node over ssh keeps the cloud marker below its own $FATPIPE_ROOT, which its sessions
    get and this machine does not: the node program reads it there."""
    from fatpipe.infra.node import READY_FILE
    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.ops.reach.wait import check_node

    class RootedNode(LocalTransport):
        def argv(self, command: str) -> list[str]:
            return ["env", f"FATPIPE_ROOT={tmp_path}", "bash", "-c", command]

    monkeypatch.delenv("FATPIPE_ROOT", raising=False)
    marker = Path(f"{tmp_path}{READY_FILE}")
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"iface": "lo", "mtu": 65536, "namespaced": []}))
    node = parse_outputs({"name": "c", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
                          "nodes": [{"name": "c-0", "private_ip": "127.42.0.10", "transport": "local"}]}).nodes[0]
    state = check_node(RootedNode("c-0"), node, {})
    assert state.ready, state.reason


def test_ups_training_launch_takes_the_versions_netchecks_launch_read(tmp_path, counted, monkeypatch):
    """Within one `fatpipe up` (its cluster's answers.keeping) the environment is read once: the training's
    launch asks no version probe while nothing was built or copied on a node; one that was is
    asked again, and outside `up` every launch asks."""
    from fatpipe.ops.env.nodeenv import check_node_envs, probe_step
    from fatpipe.ops.reach.asknode import drop_kept
    from fatpipe.ops.run.checks import launch_steps

    nodes, cluster = two_home_nodes(tmp_path)
    monkeypatch.setattr("fatpipe.ops.run.prepare.data_excludes", lambda *args: ())
    for i in range(2):
        (tmp_path / f"home-{i}" / "proj").mkdir()
    with cluster.answers.keeping():
        reports = []
        for run in ("netcheck", "train"):
            counted.clear()
            reports.append(check_node_envs(nodes, tmp_path / run))
            cluster.answers.forget_all()  # a launch's end
            assert (tmp_path / run / "env.json").is_file()
        assert dict(counted) == {}, dict(counted)  # the training's: nothing asked
        assert reports[0] == reports[1]
        assert all(probe_step(n) not in launch_steps(n, cluster, False, None) for n in nodes)
        drop_kept(nodes[0].transport)  # its project folder got new files
        counted.clear()
        check_node_envs(nodes, tmp_path / "again")
        assert dict(counted) == {"n0": 1}
    counted.clear()
    check_node_envs(nodes, tmp_path / "outside")
    assert dict(counted) == {"n0": 1, "n1": 1}
    assert all(probe_step(n) in launch_steps(n, cluster, False, None) for n in nodes)
