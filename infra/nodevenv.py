"""The venv an ssh node runs in: what it holds (its cluster's `[node]` resolved) and its stamp.

docs/ARCHITECTURE.md, "The node environment": torch, numpy and the project's requirements; the
stamp covers the whole declaration, so the venv is rebuilt exactly when it changes. How it is
built: ops/env/venvs.py (every ssh node, clouds' too: one download, installed offline
everywhere). Nothing here reaches a cloud node's user data: a new stamp never makes a new node.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

from .errors import FatpipeError
from .node import REMOTE_VENV
from .nodespec import CPU_TORCH_INDEX, DEFAULT_REQUIREMENTS, node_of, node_table, requirement

TORCH_SPEC_ENV = "FATPIPE_TORCH"  # what the node venv installs for torch (default: this torch's version)
TORCH_INDEX_ENV = "FATPIPE_TORCH_INDEX_URL"
STAMP_FILE = f"{REMOTE_VENV}/.fatpipe-stamp"
# fault_tolerance = "live"'s library (trainer/live; docs/ARCHITECTURE.md, "Live fault tolerance").
# Its wheels are CPython 3.10-3.12 on x86_64 alone, as pyproject.toml declares it: a node outside
# them gets none and trains with fault_tolerance = "restart".
TORCHFT = "torchft==0.2.0"
TORCHFT_MARKER = 'python_version >= "3.10" and python_version < "3.13" and platform_machine == "x86_64"'


@dataclass(frozen=True)
class NodeVenv:
    """The resolved declaration: every value is checked and reaches pip as one quoted argument."""

    torch: str  # a requirement naming torch, e.g. torch==2.13.0
    index: str  # torch's index URL; "" is pip's default (PyPI: CUDA builds on Linux)
    packages: tuple[str, ...] = ()
    requirements: str | None = None  # a file in the project folder, which travels with it


def project_requirements(venv: NodeVenv) -> list[str]:
    """What the project adds, as pip arguments: its requirements file and packages."""
    return [*(["-r", venv.requirements] if venv.requirements else []), *venv.packages]


def base_requirements(venv: NodeVenv) -> list[str]:
    """What every node venv must install, as pip arguments: torch (pinned), numpy (PowerSGD
    needs it), then the project's."""
    return [venv.torch, "numpy", *project_requirements(venv)]


def venv_requirements(venv: NodeVenv, torchft: str = f"{TORCHFT}; {TORCHFT_MARKER}") -> list[str]:
    """base_requirements and torchft (live fault tolerance), which a node venv installs where
    its wheel can be had."""
    return [*base_requirements(venv), torchft]


def torch_spec() -> str:
    """The torch requirement node venvs install by default: $FATPIPE_TORCH, else this machine's version."""
    if os.environ.get(TORCH_SPEC_ENV):
        try:
            return requirement(os.environ[TORCH_SPEC_ENV])
        except ValueError as e:
            raise FatpipeError(f"${TORCH_SPEC_ENV}: {e}", exit_code=2) from None
    return "torch==" + version("torch").split("+")[0]


def node_venv(project, cluster, gpus: int) -> NodeVenv:
    """The node table of `cluster`, the cluster's model its caller holds (`[node]` and its
    `[clusters.<name>.node]`, infra/nodespec.py; None: `[node]` alone), with its defaults filled
    in for nodes with `gpus` GPUs each."""
    spec = node_of(project.spec.node, cluster)
    index = spec.torch_index
    if index is None:
        index = os.environ.get(TORCH_INDEX_ENV, "" if gpus else CPU_TORCH_INDEX)
    requirements = spec.requirements
    if requirements is None:
        requirements = DEFAULT_REQUIREMENTS if (project.root / DEFAULT_REQUIREMENTS).is_file() else None
    elif not (project.root / requirements).is_file():
        table = node_table(cluster, "requirements")
        raise FatpipeError(f"{table} requirements = {requirements!r}: no such file in {project.root}", exit_code=2)
    return NodeVenv(spec.torch or torch_spec(), index, tuple(spec.packages), requirements)


def venv_stamp(project_root: Path, venv: NodeVenv) -> str:
    """What a node venv was built from: the declaration, pyproject.toml and the requirements file."""
    digest = hashlib.sha256(json.dumps([asdict(venv), venv_requirements(venv)], sort_keys=True).encode())
    for name in ("pyproject.toml", venv.requirements):
        path = project_root / name if name else None
        digest.update(path.read_bytes() if path and path.is_file() else b"-")
    return digest.hexdigest()[:16]
