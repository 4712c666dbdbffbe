"""What every node gets from this machine besides the data: the project folder minus what is
never shipped, and the trainer package."""

from __future__ import annotations

from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER

# Never shipped to nodes, on top of each folder's .gitignore.
SYNC_EXCLUDES = (
    ".git", ".venv", "venv", ".fatpipe", "cdktf.out", "__pycache__", "*.pyc", "node_modules",
    ".tools", ".pytest_cache", ".ruff_cache", "*.egg-info", "build", "dist",
    PROJECT_MARKER,  # the node's own mark: never sent, never deleted
)


def trainer_package_dir() -> Path:
    """The folder of the installed fatpipe.trainer (an editable install may load it as a namespace)."""
    import fatpipe.trainer

    for entry in fatpipe.trainer.__path__:
        if (Path(entry) / "__main__.py").is_file():
            return Path(entry)
    raise FatpipeError("cannot find the fatpipe.trainer package folder to ship to the nodes")
