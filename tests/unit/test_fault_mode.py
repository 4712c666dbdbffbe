"""fault_tolerance = "auto" (the default): live where it works, restart elsewhere, with the reason;
the launch's fall back to restart where a node has no torchft."""

from __future__ import annotations

import json
import shlex

import pytest

from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runs import new_run
from fatpipe.infra.trainspec import TrainSpec
from fatpipe.ops.rdzv.faultmode import choose_fault_mode, without_torchft
from fatpipe.ops.rdzv.rendezvous import new_rendezvous, read_rendezvous, restart_instead
from fatpipe.ops.reach.cluster import Cluster

from .test_rendezvous import sim_outputs


@pytest.mark.parametrize(("train", "nodes", "runs", "mode", "why"), [
    ({}, 3, "trainer", "live", "built-in trainer on 3 nodes"),
    ({}, 2, "trainer", "restart", "2 node(s); live needs 3"),
    ({}, 1, "trainer", "restart", "1 node(s)"),
    ({}, 4, "script", "restart", "a script runs live when it sets"),
    ({"comm": "diloco"}, 4, "trainer", "restart", "comm=diloco syncs every few steps"),
    ({"auto_periodic": True}, 4, "trainer", "restart", "auto_periodic syncs every few steps"),
    ({"cross_comm": "diloco"}, 4, "trainer", "restart", "cross_comm = diloco syncs between regions"),
    # A named per-step hook with auto_periodic: cross_comm auto's DiLoCo between regions.
    ({"comm": "bf16", "auto_periodic": True}, 4, "trainer", "restart", "auto_periodic syncs"),
    ({"comm": "bf16", "auto_periodic": True, "cross_comm": "flat"}, 4, "trainer", "live", "4 nodes"),
    ({"comm": "powersgd"}, 3, "trainer", "live", "3 nodes"),
    ({"fault_tolerance": "restart"}, 4, "trainer", "restart", "[train] fault_tolerance"),
    ({"fault_tolerance": "live"}, 2, "script", "live", "[train] fault_tolerance"),
])
def test_auto_is_live_where_it_works(train, nodes, runs, mode, why):
    chosen = choose_fault_mode(TrainSpec(**train), nodes, runs)
    assert chosen.mode == mode and why in chosen.why, chosen
    assert chosen.auto == ("fault_tolerance" not in train)
    assert chosen.line().startswith(f"fault tolerance: {mode} (")


def test_a_benchmark_entry_restarts_and_says_nothing():
    assert choose_fault_mode(TrainSpec(), 4, "entry").why == ""
    assert choose_fault_mode(TrainSpec(fault_tolerance="live"), 4, "entry").mode == "live"  # refused later


def test_the_trainer_is_told_the_mode_in_force_never_auto(project_dir):
    project = load_project()
    for nodes, mode in ((3, "live"), (2, "restart")):
        run_id, run_dir = new_run(project, "demo")
        rdzv = new_rendezvous(Cluster(project, outputs=parse_outputs(sim_outputs(nodes))), run_id, run_dir)
        assert rdzv.fault_tolerance == mode and rdzv.fault_auto
        assert rdzv.entry[rdzv.entry.index("--fault-tolerance") + 1] == mode


def test_a_live_run_auto_chose_turns_restart_and_its_files_say_so(project_dir):
    project = load_project()
    run_id, run_dir = new_run(project, "demo")
    live = new_rendezvous(Cluster(project, outputs=parse_outputs(sim_outputs(3))), run_id, run_dir)
    assert without_torchft({"demo-0": {"torchft": "0.2.0"}, "demo-1": {"torchft": None},
                            "demo-2": {}}) == ["demo-1", "demo-2"]
    rdzv = restart_instead(live, run_dir, "no torchft on demo-1")
    assert live.live and not rdzv.live and read_rendezvous(run_dir) == rdzv
    assert rdzv.fault_why == "auto: no torchft on demo-1" and rdzv.lighthouses == []
    for node in rdzv.nodes:
        script = (run_dir / f"node-{node.rank}.sh").read_text()
        argv = shlex.split(script.split('exec "$PY" ', 1)[1].replace("\\\n", " "))
        assert argv[argv.index("--nnodes") + 1] == "3"  # one rendezvous again, on node 0
        assert argv[argv.index("--fault-tolerance") + 1] == "restart"
        env = (run_dir / f"node-{node.rank}.env").read_text()
        assert "FATPIPE_LIVE_" not in env and "FATPIPE_NODES" not in env


def test_the_launch_turns_an_auto_live_run_restart_where_a_node_has_no_torchft(project_dir, monkeypatch):
    """ops.run.launch.checked_envs: the node environment check's report names a node without
    torchft, so the `auto` live plan becomes restart, and the decision line says why; a node set
    with torchft keeps live."""
    import json

    from fatpipe.ops.run import launch

    project = load_project()
    outputs = parse_outputs(sim_outputs(3))
    seen: list[bool] = []

    def check(nodes, run_dir, live):
        seen.append(live)  # an `auto` plan is not refused for want of torchft
        reports = {n.name: {"torchft": None if n.plan.rank == 1 else "0.2.0"} for n in nodes}
        (run_dir / "env.json").write_text(json.dumps({"nodes": reports, "same": True}))
        return "python 3.11 on 3 nodes"

    monkeypatch.setattr(launch, "check_node_envs", check)
    lines: list[str] = []
    run_id, run_dir = new_run(project, "demo")
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir)
    nodes = launch.node_runs(rdzv, Cluster.resolve(project, "demo"))
    turned, nodes = launch.checked_envs(rdzv, nodes, run_dir, Cluster.resolve(project, "demo", log=lines.append))
    assert seen == [False] and not turned.live and read_rendezvous(run_dir) == turned
    assert all(not n.rdzv.live for n in nodes)
    assert lines[-1] == "fault tolerance: restart (auto: no torchft on demo-1)", lines
    named = project.train.model_copy(update={"fault_tolerance": "live"})
    run_id, run_dir = new_run(project, "demo")
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir, train=named)
    nodes = launch.node_runs(rdzv, Cluster.resolve(project, "demo"))
    kept, _ = launch.checked_envs(rdzv, nodes, run_dir, Cluster.resolve(project, "demo", log=lines.append))
    assert seen[-1] is True and kept.live  # a named live is the check's to refuse, never turned


def regions_outputs(regions: list[str]) -> dict:
    doc = sim_outputs(len(regions))
    for node, region in zip(doc["nodes"], regions, strict=True):
        node["region"] = region
    return doc


@pytest.mark.parametrize(("flags", "key"), [
    (["--cross-comm", "diloco"], 'cross_comm = "diloco"'),
    (["--auto-periodic"], "auto_periodic = true"),
])
def test_live_across_regions_with_a_sync_between_them_is_refused_in_one_line(project_dir, run_cli, flags, key):
    """live never opens the regions: named with DiLoCo between them, the launch refuses the run
    (exit 2, one line naming both keys) before anything is written or started."""
    project = load_project()
    (project.state_dir("demo") / "outputs.json").parent.mkdir(parents=True, exist_ok=True)
    (project.state_dir("demo") / "outputs.json").write_text(json.dumps(regions_outputs(["r0", "r0", "r1"])))
    result = run_cli("launch", "--fault-tolerance", "live", *flags)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and 'fault_tolerance = "live"' in lines[0] and key in lines[0], lines
    assert "regions (r0, r1)" in lines[0], lines
    assert not list((project.state_dir("demo") / "runs").glob("*/rendezvous.json"))
    # auto takes restart for it; live with a flat ring, or on one region, is not refused.
    for train, outputs, mode in ((TrainSpec(cross_comm="diloco"), regions_outputs(["r0", "r0", "r1"]), "restart"),
                                 (TrainSpec(fault_tolerance="live"), regions_outputs(["r0", "r0", "r1"]), "live"),
                                 (TrainSpec(fault_tolerance="live", cross_comm="diloco"), sim_outputs(3), "live")):
        run_id, run_dir = new_run(project, "demo")
        assert new_rendezvous(Cluster(project, outputs=parse_outputs(outputs)), run_id, run_dir, train=train).fault_tolerance == mode


def test_up_refuses_it_before_deploying_a_cluster_that_declares_regions(project_dir, run_cli, monkeypatch):
    from fatpipe.cli.up import Up

    def deployment(self):
        raise AssertionError("deployed a cluster for a run that is refused")

    monkeypatch.setattr(Up, "deployment", deployment)
    (project_dir / "fatpipe.toml").write_text(
        '[clusters.rg]\nprovider = "sim"\nnodes = 3\nisolation = "netns"\nregions = 2\n'
        'cross_region_gbps = 0.1\n\n[train]\nfault_tolerance = "live"\ncross_comm = "diloco"\n')
    result = run_cli("up", "rg")
    assert result.exit_code == 2, result.output
    assert 'fault_tolerance = "live" with cross_comm = "diloco" across regions (r0, r1)' in result.output
    assert not (project_dir / ".fatpipe" / "rg" / "outputs.json").exists()
