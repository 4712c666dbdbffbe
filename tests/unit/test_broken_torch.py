"""A node whose torch is installed but does not import: the environment probe reads versions
without importing torch (so it does not see it, and costs no torch import), and the run names
that node in one line, from torchrun's own import of torch there (issue 35, item 2)."""

from __future__ import annotations

import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

from fatpipe.ops.env.nodeenv import check_node_envs
from fatpipe.ops.rdzv.noderun import LaunchResult, NodeRun
from fatpipe.ops.rdzv.rendezvous import NodePlan, Rendezvous
from fatpipe.ops.reach.transport import LocalTransport
from fatpipe.ops.run.failure import describe_failure
from fatpipe.ops.run.launch import follow_nodes, start_nodes

BROKEN = 'raise ImportError("libtorch_cpu.so: cannot open shared object file: No such file or directory")\n'


def broken_python(folder: Path) -> Path:
    """An interpreter that finds, first on its path, a torch of this machine's version (its own
    installed metadata beside it) whose `__init__` raises, as a torch with a missing library does."""
    site = folder / "broken-site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(BROKEN)
    dist = metadata.distribution("torch")
    info = Path(dist._path)  # the real torch's .dist-info folder
    shutil.copytree(info, site / info.name)
    python = folder / "broken-python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def nodes_with(folder: Path, pythons: list[str]) -> list[NodeRun]:
    run_rel = "runs/r1"
    (folder / run_rel).mkdir(parents=True, exist_ok=True)
    plans = [NodePlan(rank=i, name=f"n{i}", transport="local", private_ip=f"127.0.0.{10 + i}",
                      public_ip=None, netns=None, workdir=str(folder), python=python)
             for i, python in enumerate(pythons)]
    rdzv = Rendezvous(run_id="r1", cluster="c", provider="sim", nnodes=len(plans), nproc_per_node=1,
                      rdzv_backend="c10d", rdzv_endpoint="127.0.0.10:1", max_restarts=0, join_timeout_s=10,
                      run_rel=run_rel, entry=[], builtin_trainer=False, tier_gbps=1, created="", nodes=plans)
    return [NodeRun(rdzv, plan, LocalTransport(plan.name)) for plan in plans]


def test_a_node_whose_torch_does_not_import_is_named_in_one_line(tmp_path):
    broken = broken_python(tmp_path)
    nodes = nodes_with(tmp_path, [sys.executable, str(broken)])
    # The probe imports no torch: the broken one reads as the same version, and passes.
    line = check_node_envs(nodes, tmp_path / "runs/r1")
    assert f"torch {metadata.version('torch')}" in line and "2 node(s) alike" in line
    # Node 0 waits for its peer as torchrun would; node 1's torchrun dies importing torch.
    scripts = ["sleep 2; echo 'torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: gave up' >&2; exit 1",
               f"exec {broken} -m torch.distributed.run --nnodes 2 job.py"]
    for node, script in zip(nodes, scripts, strict=True):
        (tmp_path / f"runs/r1/node-{node.plan.rank}.sh").write_text(script + "\n")
    since = time.time()
    start_nodes(nodes)
    result = LaunchResult("r1", tmp_path / "runs/r1")
    result.exit_codes = follow_nodes(nodes, None, timeout_s=120, fail_grace_s=30, stopped=result.stopped)
    failure = describe_failure(result, nodes[0].rdzv, since - 1)
    assert failure is not None and "\n" not in failure
    assert failure.startswith("n1: torch does not import there (ImportError: libtorch_cpu.so"), failure
