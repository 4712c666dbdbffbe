"""Rendezvous files: c10d on node 0's private IP, one store host, interfaces resolved on the node."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runs import find_run, new_run
from fatpipe.ops.rdzv.nodefiles import IFACE_AWK, lighthouse_args
from fatpipe.ops.rdzv.rendezvous import (
    RunOptions,
    new_rendezvous,
    read_rendezvous,
    remote_dir,
)
from fatpipe.ops.reach.cluster import Cluster


def sim_outputs(n=2, port=29400):
    return {
        "name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
        "rdzv_port": port,
        "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local"}
                  for i in range(n)],
    }


def ssh_outputs():
    return {
        "name": "demo", "provider": "aws", "region": "us-east-1", "tier_gbps": 10,
        "private_cidr": "10.42.0.0/24", "ssh_user": "ubuntu", "gpus_per_node": 2,
        "nodes": [{"name": f"demo-{i}", "public_ip": f"54.1.2.{i + 3}", "private_ip": f"10.42.0.{10 + i}",
                   "transport": "ssh"} for i in range(2)],
    }


def test_files_for_loopback_nodes(project_dir):
    """fault_tolerance = "restart": one rendezvous for the whole cluster, on node 0."""
    project = load_project()
    outputs = parse_outputs(sim_outputs(3))
    run_id, run_dir = new_run(project, "demo")
    restart = project.train.model_copy(update={"fault_tolerance": "restart"})
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir, train=restart,
                          options=RunOptions(max_restarts=2))

    doc = json.loads((run_dir / "rendezvous.json").read_text())
    assert doc["rdzv_backend"] == "c10d" and doc["rdzv_endpoint"] == "127.42.0.10:29400"
    assert doc["nnodes"] == 3 and doc["nproc_per_node"] == 1 and doc["max_restarts"] == 2
    assert [n["rank"] for n in doc["nodes"]] == [0, 1, 2]
    assert read_rendezvous(run_dir) == rdzv
    assert find_run(project, "demo") == (run_id, run_dir)

    for rank in range(3):
        script = (run_dir / f"node-{rank}.sh").read_text()
        argv = shlex.split(script.split('exec "$PY" ', 1)[1].replace("\\\n", " "))
        assert argv[argv.index("--rdzv-endpoint") + 1] == "127.42.0.10:29400"
        assert argv[argv.index("--rdzv-id") + 1] == run_id
        assert argv[argv.index("--local-addr") + 1] == f"127.42.0.{10 + rank}"
        # Several loopback nodes share one host: only node 0 may host the c10d store.
        assert f"is_host={int(rank == 0)}" in argv[argv.index("--rdzv-conf") + 1]
        assert argv[argv.index("--max-restarts") + 1] == "2"
        assert argv[argv.index("--powersgd-rank") + 1] == "4" and "fatpipe.trainer" in argv
        env = (run_dir / f"node-{rank}.env").read_text()
        assert f"FATPIPE_PRIVATE_IP=127.42.0.{10 + rank}" in env and "NCCL_SHM_DISABLE=1" in env
        assert "localhost" not in script and "hostname -" not in script


def test_live_nodes_each_host_their_own_store_lighthouse_and_relay(project_dir):
    """fault_tolerance = "live": one torchrun per node, each its own store host, Lighthouse and
    relay on ports of its own (loopback nodes share one machine's ports); every node's trainer
    reaches the serving Lighthouse through its relay on loopback."""
    project = load_project()
    outputs = parse_outputs(sim_outputs(3, port=29500))
    run_id, run_dir = new_run(project, "demo")
    train = project.train.model_copy(update={"fault_tolerance": "live"})
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir, train=train)
    assert rdzv.live and rdzv.lighthouse == "127.42.0.10:29501" and rdzv.min_replicas == 2
    assert rdzv.lighthouses == ["127.42.0.10:29501", "127.42.0.11:29504", "127.42.0.12:29507"]
    assert read_rendezvous(run_dir) == rdzv
    for rank, port in enumerate((29500, 29503, 29506)):
        script = (run_dir / f"node-{rank}.sh").read_text()
        argv = shlex.split(script.split('exec "$PY" ', 1)[1].replace("\\\n", " "))
        assert argv[argv.index("--nnodes") + 1] == "1"
        assert argv[argv.index("--rdzv-endpoint") + 1] == f"127.42.0.{10 + rank}:{port}"
        assert "is_host=1" in argv[argv.index("--rdzv-conf") + 1]
        assert argv[argv.index("--fault-tolerance") + 1] == "live"
        env = (run_dir / f"node-{rank}.env").read_text()
        assert f"FATPIPE_LIVE_LIGHTHOUSE=127.0.0.1:{port + 2}" in env and "FATPIPE_NODES=3" in env
        assert "FATPIPE_LIVE_MIN_REPLICAS=2" in env
        assert lighthouse_args(rdzv, rank) == [
            "--relay-port", str(port + 2), "--lighthouses", ",".join(rdzv.lighthouses),
            "--host", f"127.42.0.{10 + rank}", "--port", str(port + 1), "--min-replicas", "2"]
    two = new_rendezvous(Cluster(project, outputs=parse_outputs(sim_outputs(2, port=29500))),
                         *new_run(project, "demo"), train=train)
    # Two nodes: no majority survives a loss, so node 0's Lighthouse alone, asking for one.
    assert two.lighthouses == ["127.42.0.10:29501"] and two.min_replicas == 1
    assert lighthouse_args(two, 1) == ["--relay-port", "29505", "--lighthouses", "127.42.0.10:29501"]
    with pytest.raises(FatpipeError, match="not a torchrun entry of its own"):
        new_rendezvous(Cluster(project, outputs=outputs), *new_run(project, "demo"), train=train, entry=["-m", "x"])
    with pytest.raises(FatpipeError, match="leaves no room for 3 nodes' stores, Lighthouses"):
        new_rendezvous(Cluster(project, outputs=parse_outputs(sim_outputs(3, port=65528))), *new_run(project, "demo"),
                       train=train)


def test_an_older_runs_rendezvous_still_reads(project_dir):
    """rendezvous.json of a run from before `ships_trainer` was dropped (always true then)."""
    project = load_project()
    run_id, run_dir = new_run(project, "demo")
    rdzv = new_rendezvous(Cluster(project, outputs=parse_outputs(sim_outputs())), run_id, run_dir)
    path = run_dir / "rendezvous.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"ships_trainer": True}))
    assert read_rendezvous(run_dir) == rdzv


def test_ssh_nodes_get_remote_paths(project_dir, monkeypatch):
    monkeypatch.delenv("FATPIPE_REMOTE_DIR", raising=False)
    project = load_project()
    outputs = parse_outputs(ssh_outputs())
    run_id, run_dir = new_run(project, "demo")
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir)
    assert rdzv.nproc_per_node == 2 and rdzv.nodes[1].ssh_user == "ubuntu"
    assert rdzv.nodes[0].workdir == "fatpipe/demo" and rdzv.nodes[0].python == ".fatpipe/venv/bin/python"
    script = (run_dir / "node-1.sh").read_text()
    assert "PYTHONPATH=\"$PWD/.fatpipe/pkg" in script and "--local-addr 10.42.0.11" in script
    assert "NCCL_SHM_DISABLE" not in (run_dir / "node-1.env").read_text()
    assert remote_dir("c", "c-1", "/scratch/{cluster}/{node}") == "/scratch/c/c-1"
    with pytest.raises(FatpipeError, match="placeholder"):
        remote_dir("c", "c-1", "{where}")

    # A given interpreter replaces the venv; a script outside the project cannot be shipped.
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir, options=RunOptions(remote_python="/opt/py/bin/python"))
    assert rdzv.nodes[0].python == "/opt/py/bin/python"
    outside = project_dir.parent / f"{project_dir.name}-elsewhere.py"
    outside.write_text("")
    try:
        with pytest.raises(FatpipeError, match="outside the project folder"):
            new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir, script=[str(outside)])
    finally:
        outside.unlink()


IP_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever
3: ens5    inet 10.42.0.11/24 brd 10.42.0.255 scope global ens5\\       valid_lft forever
4: br0    inet 10.0.0.1/8 scope global br0\\       valid_lft forever
"""


@pytest.mark.parametrize("ip, iface", [
    ("10.42.0.11", "ens5"),  # the interface holding the address, not the broader 10/8 bridge
    ("127.42.0.10", "lo"),  # every loopback node's address lies in 127/8 on lo
    ("192.0.2.2", "eth0"),
    ("172.16.0.5", ""),  # not on this node: node.sh stops with a message
])
def test_interface_is_the_one_holding_the_private_ip(ip, iface):
    awk = subprocess.run(["awk", "-v", f"want={ip}", IFACE_AWK], input=IP_ADDR,
                         capture_output=True, text=True, check=True)
    assert awk.stdout.strip() == iface


def test_cli_keeps_the_script_apart_from_the_cluster(run_cli, project_dir):
    (project_dir / "outputs.json").write_text(json.dumps(sim_outputs()))
    (project_dir / "train.py").write_text("print('hi')\n")
    result = run_cli("rendezvous", "--outputs", "outputs.json", "--max-restarts", "0",
                     "--", "train.py", "--lr", "3e-4")
    assert result.exit_code == 0, result.output
    run_id = (project_dir / ".fatpipe/demo/runs/latest").read_text().strip()
    script = (project_dir / f".fatpipe/demo/runs/{run_id}/node-0.sh").read_text()
    # The user's script, not the built-in trainer, through the wrapper that records its first error.
    assert "-m fatpipe.trainer.api.userscript \\\n  train.py \\\n  --lr 3e-4" in script and "--out" not in script

    result = run_cli("rendezvous", "demo", "--outputs", "outputs.json", "--preset", "tiny", "--steps", "7")
    assert result.exit_code == 0, result.output
    run_id = (project_dir / ".fatpipe/demo/runs/latest").read_text().strip()
    script = (project_dir / f".fatpipe/demo/runs/{run_id}/node-1.sh").read_text()
    assert "--preset tiny" in script and "--steps 7" in script

    result = run_cli("rendezvous", "--outputs", "outputs.json", "--steps", "0")
    assert result.exit_code == 2 and "--steps" in result.output


def test_sim_nodes_over_ssh_share_this_machines_cores_too(project_dir):
    """A sim node reached over ssh (its own disk, this machine's CPUs) pins its threads as the
    other sim nodes do: unpinned, each rank used every core."""
    project = load_project()
    outputs = sim_outputs(2)
    for node in outputs["nodes"]:
        node |= {"transport": "ssh", "public_ip": node["private_ip"], "netns": f"ns-{node['name']}"}
    run_id, run_dir = new_run(project, "demo")
    new_rendezvous(Cluster(project, outputs=parse_outputs(outputs | {"ssh_user": "root"})), run_id, run_dir)
    env = (run_dir / "node-1.env").read_text()
    assert "\nOMP_NUM_THREADS=" in env and "NCCL_SHM_DISABLE=1" in env
