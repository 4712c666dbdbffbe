"""Run ids, run folders under .fatpipe/<cluster>/runs/, and where a cluster's outputs file lives."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from .errors import FatpipeError
from .files import write_atomic

LATEST = "latest"  # a text file beside the run folders holding the newest run id


def outputs_file(project, cluster_name: str) -> Path:
    """`.fatpipe/<cluster>/outputs.json`, the deploy step's result (docs/ARCHITECTURE.md, "Where state lives")."""
    return project.state_dir(cluster_name) / "outputs.json"


def load_outputs(project, cluster_name: str, path: str | os.PathLike | None = None):
    """The cluster's outputs: an explicit file if given, else the one deploy wrote."""
    from .outputs import read_outputs

    return read_outputs(Path(path) if path else outputs_file(project, cluster_name), cluster_name)


def new_run_id() -> str:
    """A sortable, unique id usable as a torchrun --rdzv-id: UTC time plus 4 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def runs_dir(project, cluster_name: str) -> Path:
    return project.state_dir(cluster_name) / "runs"


def run_dir(project, cluster_name: str, run_id: str) -> Path:
    return runs_dir(project, cluster_name) / run_id


def new_run(project, cluster_name: str) -> tuple[str, Path]:
    """Make a fresh run folder, mark it the latest, and return its id and path."""
    run_id = new_run_id()
    path = run_dir(project, cluster_name, run_id)
    path.mkdir(parents=True)
    write_atomic(runs_dir(project, cluster_name) / LATEST, run_id + "\n")
    return run_id, path


def find_run(project, cluster_name: str, run_id: str | None = None) -> tuple[str, Path]:
    """An existing run by id, or the latest one; a clear error when there is none."""
    base = runs_dir(project, cluster_name)
    if run_id is None:
        marker = base / LATEST
        if not marker.exists():
            raise FatpipeError(f"cluster {cluster_name} has no runs yet (fatpipe launch {cluster_name})")
        run_id = marker.read_text().strip()
    path = base / run_id
    if not (path / "rendezvous.json").exists():
        known = sorted(p.parent.name for p in base.glob("*/rendezvous.json")) if base.exists() else []
        hint = f"; recent runs: {', '.join(known[-5:])}" if known else ""
        raise FatpipeError(f"no run {run_id} for cluster {cluster_name}{hint}")
    return run_id, path
