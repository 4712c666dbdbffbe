"""A run folder between this machine and its ssh nodes: the node is the source of truth for what
it produced (docs/ARCHITECTURE.md, "The run folder").

A push sends only a run's inputs and never deletes: the checkpoints, per-rank parts, metrics,
events, faults, summaries and logs a node wrote stay as they are, so `launch --run ID` resumes
from them. A pull lands in a partial folder of its own (`.pull-<node>-*` in the run folder), is
checked, and only then moves into place file by file; each node brings its own per-node files
and never another node's, and the inputs here are never replaced by a node's copy. Checkpoints
stay on the nodes unless asked for (they are large).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from fatpipe.infra.defaults import NETCHECK_FILE, RENDEZVOUS_FILE

from ..rdzv.noderun import NodeRun
from ..reach.transport import Result, fan_out
from .headline import keep_headline

# What a push of a run folder sends: the rendezvous, each node's env and script, and the link
# measurement comm=auto reads. Everything else in a run folder is made on the nodes.
# manifest.json: the input of a data-staging run (ops.data.stage), which goes through the same path.
RUN_INPUTS = (RENDEZVOUS_FILE, "node-*.env", "node-*.sh", NETCHECK_FILE, "manifest.json")
CHECKPOINTS = "checkpoints"
PULL_PREFIX = ".pull-"
# rsync's exit status when files vanished between its listing and their copy: a running run
# renames its files into place, so the pull came whole but for files that no longer exist.
RSYNC_VANISHED = 24
# node-<rank>.log, .pid, .ident, .keeper, .exit, .stop, .earlier.log: written by that node's wrapper alone.
_PER_NODE = re.compile(r"^node-(\d+)\.")


def remote_run(node: NodeRun) -> str:
    """The run folder on the node (relative to its login home when the workdir is)."""
    return f"{node.plan.workdir}/{node.rdzv.run_rel}"


def push_run(node: NodeRun, run_dir: Path, made: bool = False) -> Result:
    """Send the run's inputs to the node (`made`: its run folder exists); nothing the node made is
    deleted or replaced."""
    return node.transport.push_files(Path(run_dir), remote_run(node), RUN_INPUTS, made=made)


def is_input(name: str) -> bool:
    return any(fnmatch(name, pattern) for pattern in RUN_INPUTS)


def belongs_elsewhere(rel: Path, rank: int) -> bool:
    """Whether the pulled file `rel` (relative to the run folder) is not the node's to bring:
    an input (this machine's copy is the truth) or another node's per-node file."""
    if rel.parts and rel.parts[0] == CHECKPOINTS:
        return False
    if is_input(rel.name):
        return True
    own = _PER_NODE.match(rel.name)
    return bool(own) and int(own.group(1)) != rank


@dataclass
class Pulled:
    """What pulls brought: files placed per node, and one line per node whose pull failed."""

    placed: dict[str, list[str]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


def into_partial(parent: Path, label: str, copy: Callable[[Path], Result],
                 expect: str) -> tuple[Path | None, str | None]:
    """Run `copy` into a fresh partial folder (`.pull-<label>-*` inside `parent`, so that a rename
    from it into place is atomic) and check it: rsync's status, and that `expect` (a path inside
    it) came; files that vanished on the source mid-copy are not missed. (the folder, None), or
    (None, why) with the folder removed; nothing is placed yet."""
    partial = Path(tempfile.mkdtemp(prefix=f"{PULL_PREFIX}{label}-", dir=parent))
    try:
        result = copy(partial)
    except BaseException:  # Ctrl-C mid-copy: no partial folder left behind
        shutil.rmtree(partial, ignore_errors=True)
        raise
    why = None if result.ok or result.returncode == RSYNC_VANISHED else result.reason()
    if why is None and not (partial / expect).exists():
        why = f"{expect} is missing there"
    if why is None:
        return partial, None
    shutil.rmtree(partial, ignore_errors=True)
    return None, why


def pull_into_partial(node: NodeRun, run_dir: Path, checkpoints: bool) -> tuple[Path | None, str | None]:
    """Pull the node's run folder into a fresh partial folder inside `run_dir` and check it:
    (the folder, None), or (None, the one-line failure naming the node); nothing is placed yet."""
    excludes = () if checkpoints else (f"/{CHECKPOINTS}/",)
    partial, why = into_partial(
        run_dir, node.name, lambda folder: node.transport.pull(remote_run(node), folder, excludes, link_dest=run_dir),
        f"node-{node.plan.rank}.log")
    if why is None:
        return partial, None
    return None, (f"{node.transport.describe()}: could not pull run {node.rdzv.run_id} ({why}); "
                  "its files stay on the node")


def place(partial: Path, run_dir: Path, rank: int, newest: dict[Path, float]) -> list[str]:
    """Move the partial folder's files into `run_dir` (each by an atomic rename), skipping what
    `belongs_elsewhere`; a file another node of this pull already placed is replaced only by a
    newer copy (`newest`: path -> mtime). Removes the partial folder; returns what was placed."""
    placed = []
    for folder, _, files in os.walk(partial):
        for name in sorted(files):
            src = Path(folder) / name
            rel = src.relative_to(partial)
            mtime = src.lstat().st_mtime
            if belongs_elsewhere(rel, rank) or newest.get(rel, -1.0) > mtime:
                continue
            dest = run_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
            newest[rel] = mtime
            placed.append(rel.as_posix())
    shutil.rmtree(partial, ignore_errors=True)
    return sorted(placed)


def pull_runs(nodes: list[NodeRun], run_dir: Path, checkpoints: bool = False) -> Pulled:
    """Pull every ssh node's run folder into `run_dir` (in parallel), then place them one node
    after the other. Checkpoints only when asked. Nodes that share this machine's files have
    nothing to pull. A live run's record is then made from every node's here (`headline`)."""
    run_dir = Path(run_dir)
    remote = [n for n in nodes if not n.transport.shares_fs]
    pulled = Pulled()
    if not remote:
        return pulled
    run_dir.mkdir(parents=True, exist_ok=True)
    partials = fan_out(lambda n: pull_into_partial(n, run_dir, checkpoints), remote)
    newest: dict[Path, float] = {}
    for node, (partial, failure) in zip(remote, partials, strict=True):
        if failure:
            pulled.failed.append(failure)
        else:
            pulled.placed[node.name] = place(partial, run_dir, node.plan.rank, newest)
    if remote[0].rdzv.live:  # node 0's pulled copy of the run's record was its own view
        keep_headline(run_dir)
    return pulled


def checkpoint_sizes(nodes: list[NodeRun]) -> dict[str, int | None]:
    """Bytes of the run's checkpoints/ on each ssh node (0: none there; None: not measured),
    measured on the node."""
    def size(node: NodeRun) -> int | None:
        folder = f"{remote_run(node)}/{CHECKPOINTS}"
        command = f"if [ -d {shlex.quote(folder)} ]; then du -sb -- {shlex.quote(folder)}; else echo 0; fi"
        result = node.transport.run(command, timeout=120)
        first = result.stdout.split()[:1]
        return int(first[0]) if result.ok and first and first[0].isdigit() else None

    remote = [n for n in nodes if not n.transport.shares_fs]
    return dict(zip([n.name for n in remote], fan_out(size, remote), strict=True))
