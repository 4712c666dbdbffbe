"""Node environments built from one download, over real SSH, then PowerSGD training in them.

Three sim nodes with an sshd each and cold folders. "The index" is a PEP 503 index served by this
test on the operator's address of the private network, holding the local CPU torch wheel, numpy
and torch's dependencies, and counting what it serves. fatpipe builds every node's venv: node 0
downloads each wheel once, nodes 1 and 2 install from node 0 over the private links, and every
node reports the same versions. The built-in trainer then runs comm = "powersgd" (numpy) in them.
A second launch finds every venv current: the index serves nothing more.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import skip_or_fail
from wheelindex import CountingIndex

from fatpipe.infra.node import REMOTE_VENV

from .conftest import declared_env_cli, require_ssh_sim, ssh_sim_toml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

NAME, OCTET, NODES = "t-wheels", 183, 3
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-whl-")  # ssh's sockets need a short path


def fatpipe(folder: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return declared_env_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> Path:
    """torch as this machine has it (a CPU build), numpy and their dependencies, as wheel files."""
    import torch

    folder = tmp_path_factory.mktemp("index-files")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(folder),
                           f"torch=={torch.__version__}", "numpy"], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        skip_or_fail(f"no local torch wheel to serve as the index: {done.stderr.strip()[-300:]}")
    return folder


@pytest.fixture
def cluster(wheel_files, tmp_path):
    """Three sim nodes over SSH, deployed, with the counting index on the operator's address."""
    require_ssh_sim()
    (tmp_path / "fatpipe.toml").write_text(ssh_sim_toml(NAME, NODES, OCTET, """
[train]
preset = "tiny"
steps = 6
comm = "powersgd"
batch_size = 2
seq_len = 32
warmup_steps = 1
checkpoint_every = 100
node_metrics_every = 0
"""))
    index = None
    try:
        deployed = fatpipe(tmp_path, "deploy", NAME, "--yes", timeout=600)
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        index = CountingIndex(wheel_files, tmp_path.parent / f"{tmp_path.name}-index", f"10.{OCTET}.0.1")
        with open(tmp_path / "fatpipe.toml", "a") as toml:  # the nodes' environment, declared
            toml.write(f'\n[node]\ntorch_index = "{index.url}"\n')
        yield tmp_path, index
    finally:
        if index:
            index.server.shutdown()
        down = fatpipe(tmp_path, "down", NAME, timeout=300)
        assert down.returncode == 0, down.stdout[-4000:]


def latest_run(folder: Path) -> Path:
    runs = folder / ".fatpipe" / NAME / "runs"
    return runs / (runs / "latest").read_text().strip()


def test_wheels_are_fetched_once_and_every_node_installs_them_offline(cluster, wheel_files):
    import torch

    folder, index = cluster
    launched = fatpipe(folder, "launch", NAME, "--max-restarts", "0")
    assert launched.returncode == 0, launched.stdout[-6000:]
    # Every wheel left the index once (node 0's download), whatever the number of nodes.
    assert index.served and set(index.served.values()) == {1}, index.served
    assert any(name.startswith("torch-") for name in index.served)
    assert index.bytes <= sum(f.stat().st_size for f in wheel_files.glob("*.whl"))
    assert f"venv built from {NAME}-0's wheels over the private links" in launched.stdout

    outputs = json.loads((folder / ".fatpipe" / NAME / "outputs.json").read_text())
    remote_dirs = [Path(n["remote_dir"]) for n in outputs["nodes"]]
    assert all((d / REMOTE_VENV / ".fatpipe-stamp").is_file() for d in remote_dirs)
    assert [(d / ".fatpipe" / "wheels").is_dir() for d in remote_dirs] == [True, False, False]

    env = json.loads((latest_run(folder) / "env.json").read_text())
    assert env["same"] and len(env["nodes"]) == NODES, env
    assert {(r["torch"], r["numpy"] is not None) for r in env["nodes"].values()} == {(torch.__version__, True)}

    summary = json.loads((latest_run(folder) / "summary.json").read_text())
    assert summary["comm"] == "powersgd" and summary["steps"] == 6, summary

    served = sum(index.served.values())
    again = fatpipe(folder, "launch", NAME, "--max-restarts", "0")
    assert again.returncode == 0, again.stdout[-6000:]
    assert sum(index.served.values()) == served and "wheels in" not in again.stdout
