"""Get ssh nodes ready for a run: ship the project, the run folder and the trainer; make the venv.

Sim nodes share this machine's files and interpreter and need none of it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import REMOTE_PKG, REMOTE_VENV

from .datacheck import data_excludes
from .noderun import Log, NodeRun

# Never shipped to nodes, on top of each folder's .gitignore.
SYNC_EXCLUDES = (
    ".git", ".venv", "venv", ".fatpipe", "cdktf.out", "__pycache__", "*.pyc", "node_modules",
    ".tools", ".pytest_cache", ".ruff_cache", "*.egg-info", "build", "dist",
)
TORCH_SPEC_ENV = "FATPIPE_TORCH"  # what the node venv installs for torch (default: this torch's version)
TORCH_INDEX_ENV = "FATPIPE_TORCH_INDEX_URL"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_spec() -> str:
    """The torch requirement node venvs install: $FATPIPE_TORCH, else this machine's version."""
    if os.environ.get(TORCH_SPEC_ENV):
        return os.environ[TORCH_SPEC_ENV]
    from importlib.metadata import version

    return "torch==" + version("torch").split("+")[0]


def venv_stamp(project_root: Path, spec: str, index: str) -> str:
    """What a node venv was built from: the torch pin, the index, pyproject.toml, requirements.txt."""
    digest = hashlib.sha256(f"{spec}\n{index}\n".encode())
    for name in ("pyproject.toml", "requirements.txt"):
        path = project_root / name
        digest.update(path.read_bytes() if path.is_file() else b"-")
    return digest.hexdigest()[:16]


def venv_command(stamp: str, spec: str, index: str) -> str:
    """Make or reuse the project venv on a node; torch first, pinned, then requirements.txt."""
    py = f"{REMOTE_VENV}/bin/python"
    index_flag = f"--index-url {shlex.quote(index)} " if index else ""
    return (
        f"have=; [ -f {REMOTE_VENV}/.fatpipe-stamp ] && read -r have < {REMOTE_VENV}/.fatpipe-stamp; "
        f'[ "$have" = {stamp} ] && exit 0; set -e; '
        f"python3 -m venv {REMOTE_VENV}; {py} -m pip install -q --upgrade pip; "
        f"{py} -m pip install -q {index_flag}{shlex.quote(spec)}; "
        f"if [ -f requirements.txt ]; then {py} -m pip install -q -r requirements.txt; fi; "
        f"echo {stamp} > {REMOTE_VENV}/.fatpipe-stamp"
    )


def trainer_package_dir() -> Path:
    """The folder of the installed fatpipe.trainer (an editable install may load it as a namespace)."""
    import fatpipe.trainer

    for entry in fatpipe.trainer.__path__:
        if (Path(entry) / "__main__.py").is_file():
            return Path(entry)
    raise FatpipeError("cannot find the fatpipe.trainer package folder to ship to the nodes")


def prepare_node(project, node: NodeRun, run_dir: Path, gpus: int, log: Log) -> None:
    """Ship the project and the run folder to an ssh node and make sure its Python can run torch."""
    t, plan = node.transport, node.plan
    if t.shares_fs:
        return
    # The staged dataset is `fatpipe data push`'s: never shipped again, never deleted by --delete.
    excludes = SYNC_EXCLUDES + data_excludes(project, node.rdzv.cluster)
    steps: list[tuple[str, Callable[[], object]]] = [
        ("copy the project folder", lambda: t.push(project.root, plan.workdir, excludes)),
        ("copy the run folder", lambda: t.push(run_dir, f"{plan.workdir}/{node.rdzv.run_rel}", ("*.log",))),
    ]
    if node.rdzv.ships_trainer:
        trainer_dir = trainer_package_dir()
        steps.append(("copy the trainer",
                      lambda: t.push(trainer_dir, f"{plan.workdir}/{REMOTE_PKG}/fatpipe/trainer", SYNC_EXCLUDES)))
    if plan.python == f"{REMOTE_VENV}/bin/python":
        spec = torch_spec()
        index = os.environ.get(TORCH_INDEX_ENV, "" if gpus else CPU_TORCH_INDEX)
        stamp = venv_stamp(project.root, spec, index)
        steps.append(("make the venv", lambda: t.run(node.sh(venv_command(stamp, spec, index)), timeout=1800)))
    else:  # a given interpreter (an image that ships torch): only check it can
        check = f'{shlex.quote(plan.python)} -c "import torch"'
        steps.append((f"check {plan.python}", lambda: t.run(node.sh(check), timeout=120)))
    for what, step in steps:
        started = time.monotonic()
        result = step()
        if not result.ok:
            raise FatpipeError(f"{t.describe()}: {what} failed: {result.reason()}")
        log(f"{node.name}: {what} ({time.monotonic() - started:.1f} s)")


def fetch_run(node: NodeRun, run_dir: Path) -> None:
    """Bring an ssh node's run folder (logs; metrics and checkpoints on the rank-0 node) back here."""
    if not node.transport.shares_fs:
        node.transport.pull(f"{node.plan.workdir}/{node.rdzv.run_rel}", run_dir)
