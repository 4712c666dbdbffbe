"""The node venv commands, run by bash with the real venv and pip, against a local wheel folder.

Stand-in wheels for torch, numpy, torchft and a declared package (no network): node 0's command downloads
them into its wheel folder and builds its venv from that folder, which imports numpy beside
torch; the same declaration is reused as it is, and another declaration rebuilds it from empty
(a package dropped from `[node]` is gone). A peer builds the same venv from node 0's folder alone.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from fatpipe.infra.node import REMOTE_VENV
from fatpipe.infra.nodevenv import NodeVenv, venv_stamp
from fatpipe.ops.env.venvs import fetch_command, peer_command, wheel_folder

pytestmark = pytest.mark.timeout(600)


def make_wheel(folder: Path, name: str, version: str) -> None:
    """A pure-Python wheel whose module says its version."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


def build(project: Path, venv: NodeVenv, wheels: Path) -> subprocess.CompletedProcess:
    """Node 0's command; "the index" is the local folder (pip's environment, not a config file)."""
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    env.pop("VIRTUAL_ENV", None)
    command = fetch_command(venv_stamp(project, venv), venv)
    return subprocess.run(["bash", "-c", command], cwd=project, env=env, text=True, capture_output=True, timeout=500)


def imports(project: Path, module: str) -> str | None:
    done = subprocess.run([str(project / REMOTE_VENV / "bin" / "python"), "-c", f"import {module}; print({module}.__version__)"],
                          capture_output=True, text=True, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else None


def test_the_node_venv_holds_numpy_and_is_rebuilt_only_when_the_declaration_changes(tmp_path):
    wheels, project = tmp_path / "wheels", tmp_path / "project"
    wheels.mkdir()
    project.mkdir()
    for name, version in (("torch", "2.13.0"), ("numpy", "2.3.1"), ("torchft", "0.2.0"), ("einops", "0.8.0"),
                          ("tiktoken", "0.9.0")):
        make_wheel(wheels, name, version)
    (project / "reqs.txt").write_text("einops\n")
    declared = NodeVenv("torch==2.13.0", "https://download.pytorch.org/whl/cpu", ("tiktoken",), "reqs.txt")

    built = build(project, declared, wheels)
    assert built.returncode == 0, built.stderr[-3000:]
    assert [imports(project, m) for m in ("torch", "numpy", "torchft", "einops", "tiktoken")] == \
        ["2.13.0", "2.3.1", "0.2.0", "0.8.0", "0.9.0"]

    stamp = project / REMOTE_VENV / ".fatpipe-stamp"
    before = stamp.stat().st_mtime_ns
    again = build(project, declared, wheels)  # the same declaration: reused, nothing installed
    assert again.returncode == 0 and stamp.stat().st_mtime_ns == before, again.stderr[-3000:]

    peer = tmp_path / "peer"
    peer.mkdir()
    (peer / "reqs.txt").write_text("einops\n")
    folder = project / wheel_folder(venv_stamp(project, declared))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    built = subprocess.run(["bash", "-c", peer_command(venv_stamp(project, declared), declared, str(folder))],
                           cwd=peer, env=env, text=True, capture_output=True, timeout=500)
    assert built.returncode == 0, built.stderr[-3000:]
    assert [imports(peer, m) for m in ("torch", "numpy", "einops", "tiktoken")] == ["2.13.0", "2.3.1", "0.8.0", "0.9.0"]

    rebuilt = build(project, NodeVenv(declared.torch, declared.index, (), "reqs.txt"), wheels)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert imports(project, "numpy") == "2.3.1" and imports(project, "tiktoken") is None
