"""Before a launch every node reports its Python environment, over real SSH; an odd node is refused.

Two sim nodes with an sshd each (`transport = "ssh"`), deployed with the real CLI and terraform.
Each node's venv (`.fatpipe/venv`, stamped with the project's declaration, so fatpipe reuses it)
is a small wrapper around this machine's interpreter. Alike, the launch runs and shows one line
about the environment, saved as env.json. Then node 1's wrapper puts a torch that says 2.0.1
first on its path: the launch is refused before anything starts, in one line naming node 1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fatpipe.infra.node import PROJECT_MARKER, REMOTE_VENV
from fatpipe.infra.nodevenv import node_venv, venv_stamp
from fatpipe.infra.project import load_project

from .conftest import declared_env_cli, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NAME, OCTET = "t-nodeenv", 181
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-env-")  # ssh's sockets need a short path


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return declared_env_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


@pytest.fixture
def nodes_over_ssh(needs_netns, needs_ssh, tmp_path, monkeypatch):
    """Two sim nodes with sshd, deployed; destroyed afterwards whatever happened."""
    if not shutil.which("terraform"):
        pytest.skip("needs terraform on PATH")
    monkeypatch.delenv("FATPIPE_TORCH", raising=False)
    monkeypatch.delenv("FATPIPE_TORCH_INDEX_URL", raising=False)
    (tmp_path / "fatpipe.toml").write_text(f"""\
[clusters.{NAME}]
provider = "sim"
nodes = 2
tier = "1g"
isolation = "netns"
transport = "ssh"
private_cidr = "10.{OCTET}.0.0/24"
rdzv_port = {free_port()}

[node]
packages = ["einops>=0.7"]
""")
    (tmp_path / "hello.py").write_text("import numpy\nprint('numpy', numpy.__version__)\n")
    try:
        deployed = fatpipe(tmp_path, "deploy", NAME, "--yes")
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        yield tmp_path
    finally:
        down = fatpipe(tmp_path, "down", NAME, timeout=300)
        assert down.returncode == 0, down.stdout[-4000:]


def place_venv(remote_dir: Path, stamp: str, project_id: str, path_first: Path | None = None) -> None:
    """A venv fatpipe takes as built: its stamp, and a python that is this machine's interpreter."""
    venv = remote_dir / REMOTE_VENV
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (remote_dir / PROJECT_MARKER).write_text(f"{NAME}\n{project_id}\n")  # the folder is this project's
    (venv / ".fatpipe-stamp").write_text(stamp + "\n")
    prefix = f"PYTHONPATH={path_first} " if path_first else ""
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\n{prefix}exec {sys.executable} "$@"\n')
    python.chmod(0o755)


def test_a_node_with_another_torch_is_named_before_launch(nodes_over_ssh):
    import torch

    folder = nodes_over_ssh
    project = load_project(folder / "fatpipe.toml")
    stamp = venv_stamp(folder, node_venv(project, project.clusters.get(NAME), gpus=0))
    outputs = json.loads((folder / ".fatpipe" / NAME / "outputs.json").read_text())
    remote_dirs = [Path(n["remote_dir"]) for n in outputs["nodes"]]
    for remote_dir in remote_dirs:
        place_venv(remote_dir, stamp, project.project_id)

    alike = fatpipe(folder, "launch", NAME, "--max-restarts", "0", "--", "hello.py")
    assert alike.returncode == 0, alike.stdout[-4000:]
    assert "node environment (2 node(s) alike)" in alike.stdout and f"torch {torch.__version__}" in alike.stdout
    runs = folder / ".fatpipe" / NAME / "runs"
    saved = json.loads((runs / (runs / "latest").read_text().strip() / "env.json").read_text())
    assert saved["same"] and sorted(saved["nodes"]) == [f"{NAME}-0", f"{NAME}-1"]

    fake = folder.parent / f"{folder.name}-fake-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("__version__ = '2.0.1'\nclass version:\n    cuda = None\n")
    place_venv(remote_dirs[1], stamp, project.project_id, path_first=fake)
    odd = fatpipe(folder, "launch", NAME, "--max-restarts", "0", "--", "hello.py")
    assert odd.returncode != 0, odd.stdout[-4000:]
    errors = [line.split(": ", 1)[1] for line in odd.stdout.splitlines() if line.lower().startswith("error:")]
    assert errors == [f"the nodes' Python environments differ: node {NAME}-1: torch 2.0.1, "
                      f"the others {torch.__version__}"], odd.stdout[-4000:]
    assert "started run" not in odd.stdout
