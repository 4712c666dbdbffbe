"""`fatpipe data push` with no torch on the nodes, and a push with nothing changed in one round trip per node.

Two sim nodes reached over SSH. Their Python is `python3 -I -S`: no site-packages, so neither torch
nor an installed fatpipe can be imported there; the check and the chain still run (their modules
travel with the command) and the chain still moves the data node to node. Every remote command this
machine starts is counted by an `ssh` ahead of the real one on PATH (rsync's `-e ssh` too).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fatpipe.infra.node import PROJECT_MARKER

from .conftest import require_ssh_sim, ssh_sim_toml

pytestmark = pytest.mark.slow

CLUSTER, OCTET, NODES = "t-ch-rt", 235, 2
CHUNK = 1 << 20
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-tch-")
FILES = {"a.bin": 5 * CHUNK + 77, "b/c.txt": 1000}


def counting_tools(folder: Path) -> tuple[Path, Path]:
    """A bin folder with `ssh` that logs each call then runs the real one, and a torch-less python."""
    tools, log = folder / "tools", folder / "ssh-calls.log"
    tools.mkdir()
    real = subprocess.run(["bash", "-c", "command -v ssh"], capture_output=True, text=True, check=True).stdout.strip()
    (tools / "ssh").write_text(f'#!/bin/sh\necho "ssh call: $# arguments" >> {log}\nexec {real} "$@"\n')
    (tools / "python-no-site").write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    for name in ("ssh", "python-no-site"):
        (tools / name).chmod((tools / name).stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return tools, log


def fatpipe(folder: Path, tools: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "FATPIPE_SSH_CONTROL_DIR": CONTROL_DIR,
           "PATH": f"{tools}:{os.environ['PATH']}"}
    for name in ("FATPIPE_CONFIG", "FATPIPE_REMOTE_DIR"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("roundtrips")
    tools, log = counting_tools(folder)
    (folder / "fatpipe.toml").write_text(ssh_sim_toml(CLUSTER, NODES, OCTET, '[data]\nsource = "data/set"\n'
                                                      "chunk_mib = 1\n"))
    (folder / ".gitignore").write_text("data/\ntools/\nssh-calls.log\n")
    for name, size in FILES.items():
        path = folder / "data" / "set" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    deployed = fatpipe(folder, tools, "deploy", CLUSTER)
    assert deployed.returncode == 0, deployed.stdout
    try:
        yield folder, tools, log
    finally:
        down = fatpipe(folder, tools, "down", CLUSTER, timeout=300)
        assert down.returncode == 0, down.stdout


def node_data(folder: Path, index: int) -> Path:
    outputs = json.loads((folder / ".fatpipe" / CLUSTER / "outputs.json").read_text())
    return Path(outputs["nodes"][index]["remote_dir"]) / "data" / "set"


def test_the_chain_runs_where_torch_does_not_import_and_a_second_push_is_one_command_per_node(cluster):
    folder, tools, log = cluster
    python = str(tools / "python-no-site")
    hidden = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    assert hidden.returncode != 0 and "torch" in hidden.stderr  # the nodes' Python has no torch

    first = fatpipe(folder, tools, "data", "push", CLUSTER, "--remote-python", python)
    assert first.returncode == 0, first.stdout[-5000:]
    total = sum(FILES.values())
    assert f"{total} byte(s) moved node to node" in first.stdout, first.stdout[-3000:]
    for i in range(NODES):
        for name in FILES:
            assert (node_data(folder, i) / name).read_bytes() == (folder / "data" / "set" / name).read_bytes()

    log.unlink()
    again = fatpipe(folder, tools, "data", "push", CLUSTER, "--remote-python", python)
    assert again.returncode == 0, again.stdout[-5000:]
    assert "already on node 0" in again.stdout and "nothing to fan out" in again.stdout, again.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == NODES, "\n".join(calls)  # one remote command per node: claim and check together

    log.unlink()
    verify = fatpipe(folder, tools, "data", "verify", CLUSTER, "--remote-python", python)
    assert verify.returncode == 0 and verify.stdout.count("matches") == NODES, verify.stdout
    assert len(log.read_text().splitlines()) == NODES


def test_a_folder_of_another_project_is_refused_in_the_same_command(cluster):
    folder, tools, _ = cluster
    marker = node_data(folder, 1).parents[1] / PROJECT_MARKER
    kept = marker.read_text()
    marker.write_text(f"{CLUSTER}\nfeedfacecafe\n")
    try:
        refused = fatpipe(folder, tools, "data", "push", CLUSTER, "--remote-python", str(tools / "python-no-site"))
    finally:
        marker.write_text(kept)
    assert refused.returncode != 0 and "belongs to" in refused.stdout and "feedfacecafe" in refused.stdout, \
        refused.stdout[-3000:]
