"""The node environment: the `[node]` table, the venv's stamp and command, and the launch's version check."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.nodevenv import TORCHFT, TORCHFT_MARKER, node_venv, venv_stamp
from fatpipe.infra.project import Project, parse_project
from fatpipe.ops.env.nodeenv import ENV_FILE, check_node_envs, differences
from fatpipe.ops.env.venvs import fetch_command, peer_command
from fatpipe.ops.rdzv.noderun import NodeRun
from fatpipe.ops.rdzv.rendezvous import NodePlan, Rendezvous
from fatpipe.ops.reach.transport import LocalTransport

CLUSTER = '[clusters.c]\nprovider = "sim"\nnodes = 2\n'


def project(root: Path, node_table: str = "") -> Project:
    return Project(parse_project(CLUSTER + node_table, "fatpipe.toml"), root, root / "fatpipe.toml")


def test_the_node_table_takes_requirements_and_refuses_shell_text(tmp_path):
    spec = project(tmp_path, '[node]\npackages = ["einops >= 0.7", "tiktoken"]\ntorch = "torch==2.12.0"\n').spec.node
    assert spec.packages == ["einops>=0.7", "tiktoken"] and spec.torch == "torch==2.12.0"
    bad = {
        'packages = ["numpy; rm -rf ~"]': "node.packages",
        'packages = ["--index-url=http://evil"]': "node.packages",
        'packages = ["x @ https://evil/x.whl"]': "URL requirement",
        'torch = "numpy==2.0"': "does not name torch",
        'requirements = "../secrets.txt"': "inside the project folder",
        'requirements = "-r x"': "inside the project folder",
        'torch_index = "file:///tmp/x"': "not an http(s) URL",
        'pakages = []': "did you mean packages?",
    }
    for line, expected in bad.items():
        with pytest.raises(FatpipeError) as caught:
            project(tmp_path, f"[node]\n{line}\n")
        message = str(caught.value)
        assert expected in message, (line, message)


def test_defaults_follow_this_machine_and_the_nodes_gpus(tmp_path, monkeypatch):
    monkeypatch.delenv("FATPIPE_TORCH_INDEX_URL", raising=False)
    monkeypatch.setenv("FATPIPE_TORCH", "torch==2.11.0")
    plain = project(tmp_path)
    assert node_venv(plain, plain.clusters.get("c"), gpus=0).torch == "torch==2.11.0"
    assert node_venv(plain, plain.clusters.get("c"), gpus=0).index == "https://download.pytorch.org/whl/cpu"
    assert node_venv(plain, plain.clusters.get("c"), gpus=8).index == ""  # PyPI: the CUDA builds
    assert node_venv(plain, plain.clusters.get("c"), gpus=0).requirements is None
    (tmp_path / "requirements.txt").write_text("einops\n")
    assert node_venv(plain, plain.clusters.get("c"), gpus=0).requirements == "requirements.txt"
    declared = project(tmp_path, '[node]\ntorch = "torch==2.13.0"\nrequirements = "node.txt"\n')
    with pytest.raises(FatpipeError, match="no such file"):
        node_venv(declared, declared.clusters.get("c"), gpus=0)
    monkeypatch.setenv("FATPIPE_TORCH", "torch; echo hi")
    with pytest.raises(FatpipeError, match="FATPIPE_TORCH"):
        node_venv(plain, plain.clusters.get("c"), gpus=0)


def test_the_stamp_covers_the_whole_declaration(tmp_path, monkeypatch):
    monkeypatch.setenv("FATPIPE_TORCH", "torch==2.13.0")
    (tmp_path / "node.txt").write_text("einops\n")

    def stamp(table: str) -> str:
        return venv_stamp(tmp_path, node_venv(project(tmp_path, "[node]\n" + table), None, gpus=0))

    base = stamp('requirements = "node.txt"\n')
    assert base == stamp('requirements = "node.txt"\n')
    assert base != stamp('requirements = "node.txt"\npackages = ["tiktoken"]\n')
    assert base != stamp('requirements = "node.txt"\ntorch = "torch==2.12.0"\n')
    assert base != stamp('requirements = "node.txt"\ntorch_index = "https://download.pytorch.org/whl/cu128"\n')
    (tmp_path / "node.txt").write_text("einops\ntiktoken\n")
    assert base != stamp('requirements = "node.txt"\n')


def test_the_venv_installs_numpy_with_torch_and_each_requirement_as_one_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("FATPIPE_TORCH", "torch==2.13.0")
    (tmp_path / "my reqs.txt").write_text("einops\n")
    venv = node_venv(project(tmp_path, '[node]\nrequirements = "my reqs.txt"\npackages = ["a[b]>=1"]\n'), None, 0)
    fetch = fetch_command("abc", venv)
    # torch and numpy (PowerSGD needs it) from torch's index, torchft and the project's from PyPI
    torchft = shlex.quote(f"{TORCHFT}; {TORCHFT_MARKER}")
    assert "--index-url https://download.pytorch.org/whl/cpu torch==2.13.0 numpy;" in fetch
    assert "--find-links .fatpipe/wheels/abc.partial -r 'my reqs.txt' 'a[b]>=1';" in fetch
    # torchft on its own, pinned to the declared torch; without it the venv still builds
    assert f"--find-links .fatpipe/wheels/abc.partial {torchft} torch==2.13.0 || echo" in fetch
    # node 0 from its own folder; a venv's install leaves byte-compiling to the imports
    offline = "--no-index --no-compile --find-links {} torch==2.13.0 numpy -r 'my reqs.txt' 'a[b]>=1';"
    assert offline.format(".fatpipe/wheels/abc") in fetch
    assert f"--no-index --no-compile --find-links .fatpipe/wheels/abc {torchft} 2>/dev/null || echo" in fetch
    peer = peer_command("abc", venv, "http://10.0.0.10:8000/")
    assert "--find-links http://10.0.0.10:8000/ --trusted-host 10.0.0.10:8000 torch==2.13.0" in peer
    assert "pip download" not in peer


def probe_nodes(folder: Path, pythons: list[str]) -> list[NodeRun]:
    plans = [NodePlan(rank=i, name=f"n-{i}", transport="local", private_ip=f"127.0.0.{10 + i}",
                      public_ip=None, netns=None, workdir=str(folder), python=python)
             for i, python in enumerate(pythons)]
    rdzv = Rendezvous(run_id="r1", cluster="c", provider="sim", nnodes=len(plans), nproc_per_node=1,
                      rdzv_backend="c10d", rdzv_endpoint="127.0.0.10:1", max_restarts=0, join_timeout_s=10,
                      run_rel="runs/r1", entry=[], builtin_trainer=False, tier_gbps=1,
                      created="", nodes=plans)
    return [NodeRun(rdzv, plan, LocalTransport(plan.name)) for plan in plans]


def test_a_node_with_another_torch_is_named(tmp_path):
    # Node 2's interpreter finds a torch that says 2.0.1 first on its path.
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("__version__ = '2.0.1'\nclass version:\n    cuda = None\n")
    other = tmp_path / "other-python"
    other.write_text(f"#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} \"$@\"\n")
    other.chmod(0o755)
    run_dir = tmp_path / "run"
    alike = check_node_envs(probe_nodes(tmp_path, [sys.executable, sys.executable]), run_dir)
    import numpy
    import torch

    assert f"torch {torch.__version__}" in alike and f"numpy {numpy.__version__}" in alike
    with pytest.raises(FatpipeError) as caught:
        check_node_envs(probe_nodes(tmp_path, [sys.executable, sys.executable, str(other)]), run_dir)
    assert str(caught.value) == ("the nodes' Python environments differ: "
                                 f"node n-2: torch 2.0.1, the others {torch.__version__}")
    saved = json.loads((run_dir / ENV_FILE).read_text())
    assert saved["same"] is False and saved["nodes"]["n-2"]["torch"] == "2.0.1"


def test_a_live_run_is_refused_on_nodes_without_torchft(tmp_path):
    # Every node's interpreter finds a torchft it cannot tell the version of: none, as reported.
    (tmp_path / "fake" / "torchft").mkdir(parents=True)
    (tmp_path / "fake" / "torchft" / "__init__.py").write_text("")
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'fake'} exec {sys.executable} \"$@\"\n")
    bare.chmod(0o755)
    nodes = probe_nodes(tmp_path, [str(bare), str(bare)])
    assert check_node_envs(nodes, tmp_path / "run").endswith("torchft none")  # restart: fine
    with pytest.raises(FatpipeError) as caught:
        check_node_envs(nodes, tmp_path / "run", live=True)
    assert str(caught.value).startswith("node n-0: no torchft for Python 3."), caught.value
    assert str(caught.value).endswith('set [train] fault_tolerance = "restart"')
    from importlib.metadata import version

    assert check_node_envs(probe_nodes(tmp_path, [sys.executable]), tmp_path / "run", live=True) \
        .endswith(f"torchft {version('torchft')}")


def test_differences_name_the_odd_node_and_each_key():
    one = {"python": "3.12.3", "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3", "numpy": "2.3.1"}
    assert differences({"a": one, "b": dict(one)}) == []
    assert differences({"a": one, "b": dict(one), "c": one | {"numpy": None, "cuda": "12.6"}}) == [
        "node c: cuda 12.6, the others 12.8", "node c: numpy none, the others 2.3.1"]
    # Two nodes that disagree: the first node's values are "the others".
    assert differences({"a": one, "b": one | {"python": "3.11.9"}}) == ["node b: python 3.11.9, the others 3.12.3"]


def test_the_wheel_server_leaves_the_command_and_is_its_own_process_group(tmp_path):
    """Run as the transport runs it (`cd ... && ...`, output on pipes): the command returns once the
    server listens, with the server's own process group, which a kill ends whole."""
    import os
    import re
    import signal
    import subprocess

    from fatpipe.ops.env.venvs import serve_command

    (tmp_path / ".fatpipe" / "wheels" / "abc").mkdir(parents=True)
    (tmp_path / ".fatpipe" / "wheels" / "abc" / "x-1-py3-none-any.whl").write_bytes(b"w")
    done = subprocess.run(["bash", "-c", f"cd {tmp_path} && {serve_command('abc', '127.0.0.1')}"],
                          capture_output=True, text=True, timeout=300)
    pid = int(re.search(r"^pid (\d+)$", done.stdout, re.M).group(1))
    try:
        assert os.getpgid(pid) == pid
        port = int(re.search(r"port (\d+)", done.stdout).group(1))
        from urllib.request import urlopen

        with urlopen(f"http://127.0.0.1:{port}/", timeout=30) as page:
            assert "x-1-py3-none-any.whl" in page.read().decode()
    finally:
        os.killpg(pid, signal.SIGTERM)
