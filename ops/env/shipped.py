"""What every node gets from this machine besides the data: the project folder minus what is
never shipped, and the trainer package with the node package it reads its environment with."""

from __future__ import annotations

from pathlib import Path

import fatpipe.node
import fatpipe.trainer
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER, REMOTE_PKG

# Never shipped to nodes, on top of each folder's .gitignore.
SYNC_EXCLUDES = (
    ".git", ".venv", "venv", ".fatpipe", "cdktf.out", "__pycache__", "*.pyc", "node_modules",
    ".tools", ".pytest_cache", ".ruff_cache", "*.egg-info", "build", "dist",
    PROJECT_MARKER,  # the node's own mark: never sent, never deleted
)


def trainer_package_dir() -> Path:
    """The folder of the installed fatpipe.trainer (an editable install may load it as a namespace)."""
    for entry in fatpipe.trainer.__path__:
        if (Path(entry) / "__main__.py").is_file():
            return Path(entry)
    raise FatpipeError("cannot find the fatpipe.trainer package folder to ship to the nodes")


def shipped_packages() -> tuple[tuple[Path, str], ...]:
    """(folder here, its place in a node's project folder) of each package a node runs from
    REMOTE_PKG: the trainer, and fatpipe.node beside it (the trainer reads the node's
    environment through fatpipe.node.env)."""
    return ((trainer_package_dir(), f"{REMOTE_PKG}/fatpipe/trainer"),
            (fatpipe.node.HERE, f"{REMOTE_PKG}/fatpipe/node"))
