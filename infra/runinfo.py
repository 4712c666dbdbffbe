"""What a run folder says about its run, read from the files alone: outcome, steps, loss, size; pruning old ones.

Nothing here asks a node: after `fatpipe down` the folder is all there is, and it is enough
(the node wrappers write `node-<rank>.exit`, the trainer `metrics.jsonl` and `summary.json`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .defaults import NETCHECK_FILE, RENDEZVOUS_FILE, SUMMARY_FILE, UP_REPORT_FILE
from .runs import latest_run_id, read_json_checked, runs_dir

CHECKPOINTS = "checkpoints"
TAIL_BYTES = 64 * 1024  # enough of metrics.jsonl's end for its last record


@dataclass
class RunInfo:
    """One run folder as `fatpipe runs` and `status` show it."""

    id: str
    path: Path
    exits: dict[str, int | None] = field(default_factory=dict)  # node-<rank> -> recorded status
    last_step: int | None = None
    final_loss: float | None = None
    kind: str = "train"  # train | netcheck | empty
    netcheck_passed: bool | None = None
    size_bytes: int = 0
    latest: bool = False
    running: bool = False  # a node said so (ops.run.progress asks the leader of a run on ssh nodes)

    @property
    def outcome(self) -> str:
        """ok, failed (exit N), stopped, running, no exit recorded, netcheck passed/failed, or empty."""
        if self.kind == "netcheck":
            return {True: "netcheck passed", False: "netcheck failed"}.get(self.netcheck_passed, "netcheck cut short")
        if self.kind == "empty":
            return "never launched"
        codes = list(self.exits.values())
        if self.running:
            return "running"
        if not codes or all(c is None for c in codes):
            return "no exit recorded"
        bad = [c for c in codes if c not in (0, None)]
        if not bad:
            return "ok" if None not in codes else "ok on some nodes, others unknown"
        worst = max(bad, key=abs)
        return "stopped" if worst in (130, 137, 143) else f"failed (exit {worst})"


def read_json_object(path: Path) -> dict:
    """A JSON object from `path`, or {} when it is missing or unreadable (a run cut short)."""
    return read_json_checked(path)[0]


def recorded_exits(path: Path) -> dict[str, int | None]:
    """{"node-<rank>": status} from the wrapper's exit files, None where one is unreadable."""
    exits: dict[str, int | None] = {}
    for file in sorted(path.glob("node-*.exit")):
        text = file.read_text(errors="replace").strip()
        exits[file.stem] = int(text) if text.lstrip("-").isdigit() else None
    return exits


def last_record(path: Path) -> dict:
    """The last complete record of metrics.jsonl (read from its end), or {}."""
    file = path / "metrics.jsonl"
    try:
        with open(file, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            return rec
    return {}


def folder_size(path: Path) -> int:
    """Bytes on disk under `path` (allocated blocks, so sparse or tiny files count as they cost)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def run_info(path: Path, size: bool = True) -> RunInfo:
    info = RunInfo(path.name, path, exits=recorded_exits(path))
    summary, last = read_json_object(path / SUMMARY_FILE), last_record(path)
    info.last_step = summary.get("steps") if isinstance(summary.get("steps"), int) else last.get("step")
    info.final_loss = summary.get("final_loss", last.get("loss"))
    if not (path / RENDEZVOUS_FILE).exists():
        net = read_json_object(path / NETCHECK_FILE)
        if net or (path / "netcheck").is_dir():
            info.kind = "netcheck"
            info.netcheck_passed = (net.get("gate") or {}).get("passed") if isinstance(net.get("gate"), dict) else None
        else:
            info.kind = "empty"
    elif not info.exits and (path / UP_REPORT_FILE).exists():
        up = read_json_object(path / UP_REPORT_FILE)
        codes = up.get("exit_codes")
        if isinstance(codes, dict):
            info.exits = {str(k): v if isinstance(v, int) else None for k, v in codes.items()}
    if size:
        info.size_bytes = folder_size(path)
    return info


def list_runs(project, cluster_name: str, size: bool = True) -> list[RunInfo]:
    """Every run folder of the cluster, oldest first."""
    base = runs_dir(project, cluster_name)
    if not base.is_dir():
        return []
    latest = latest_run_id(project, cluster_name)
    runs = [run_info(p, size) for p in sorted(base.iterdir(), key=lambda p: p.name) if p.is_dir()]
    for info in runs:
        info.latest = info.id == latest
    return runs


def prune_runs(project, cluster_name: str, keep: int, checkpoints_only: bool = False,
               spare: set[str] | None = None) -> list[tuple[str, int]]:
    """Remove all but the newest `keep` runs (or only their checkpoints/); returns (id, bytes freed).

    The run `latest` names and those in `spare` (still running) are never touched.
    """
    runs = list_runs(project, cluster_name, size=False)
    latest = latest_run_id(project, cluster_name)
    protected = {latest, *(spare or set())}
    older = runs[:-keep] if keep > 0 else runs
    freed = []
    for info in older:
        if info.id in protected:
            continue
        target = info.path / CHECKPOINTS if checkpoints_only else info.path
        if not target.exists():
            continue
        size = folder_size(target)
        shutil.rmtree(target, ignore_errors=True)
        freed.append((info.id, size))
    return freed


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
