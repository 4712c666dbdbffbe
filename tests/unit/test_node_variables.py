"""The node's environment is one definition (fatpipe.node.env): the rendezvous writes it, the
trainer reads it back; and what ships the trainer to a node ships fatpipe.node beside it."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runs import new_run
from fatpipe.node.env import NODE_RANK, PRIVATE_IP, NodeEnv
from fatpipe.ops.env.shipped import SYNC_EXCLUDES, shipped_packages
from fatpipe.ops.rdzv.rendezvous import new_rendezvous
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.trainer import nic

from .test_rendezvous import sim_outputs


def test_the_trainer_reads_what_the_rendezvous_writes(project_dir, monkeypatch):
    project = load_project()
    run_id, run_dir = new_run(project, "demo")
    rdzv = new_rendezvous(Cluster(project, outputs=parse_outputs(sim_outputs(2))), run_id, run_dir)
    for rank, node in enumerate(rdzv.nodes):
        assert NodeEnv.from_environ(node.env) == NodeEnv(
            cluster="demo", node_name=f"demo-{rank}", node_rank=rank, private_ip=f"127.42.0.{10 + rank}",
            tier_gbps=1.0)
        for name, value in node.env.items():
            monkeypatch.setenv(name, value)
        assert nic.node_ip() == f"127.42.0.{10 + rank}"


def test_an_unset_environment_is_none_and_a_malformed_number_is_named():
    assert NodeEnv.from_environ({}) == NodeEnv() and NodeEnv().to_environ() == {}
    with pytest.raises(ValueError, match=f"^{NODE_RANK} must be a number, got 'one'$"):
        NodeEnv.from_environ({NODE_RANK: "one", PRIVATE_IP: "10.0.0.2"})


def test_the_shipped_packages_import_without_this_machines_install(tmp_path):
    """A node runs the trainer from its project folder's package folder alone: there, the
    trainer's modules that read the node's environment find fatpipe.node beside them."""
    for src, dest in shipped_packages():
        shutil.copytree(src, tmp_path / dest, ignore=shutil.ignore_patterns(*SYNC_EXCLUDES))
    pkg = tmp_path / ".fatpipe" / "pkg"
    code = ("import fatpipe.trainer.nic as nic, fatpipe.trainer.noderank, fatpipe.node.env as env\n"
            f"assert nic.__file__.startswith({str(pkg)!r}) and env.__file__.startswith({str(pkg)!r})\n"
            "print(nic.node_ip())\n")
    done = subprocess.run([sys.executable, "-S", "-c", code], env={"PYTHONPATH": str(pkg), PRIVATE_IP: "10.0.0.7"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "10.0.0.7\n", done.stderr
