"""What a user's script wrote on a node outside its run folder (checkpoints in its own `out_dir`),
brought into the local project: `fatpipe pull` and `[run] pull` (docs/ARCHITECTURE.md, "Getting
results back").

The path is checked on the node first (it exists and, links followed, lies inside the project
folder), then rsync copies it over the node's own transport into a partial folder beside the
destination (`ops.run.sync.into_partial`, the run folders' pull), and only a complete copy is
renamed into place. An existing destination is replaced only when asked, and then only after the
new copy is whole. The nodes keep everything: nothing there is deleted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runinfo import human_size

from ..data.check import node_workdir
from ..rdzv.noderun import NodeRun
from ..reach.asknode import NodeCallError, Step, answer_of, ask_ahead, step_value
from ..reach.cluster import Cluster
from ..reach.projectdir import NODE_CHECKS
from ..reach.transport import Result, Transport, fan_out
from .sync import PULL_PREFIX, into_partial

Progress = Callable[[str], None]  # one of rsync's --info=progress2 lines
MEASURE_TIMEOUT_S = 300  # du on a node's folder of checkpoints
# --no-inc-recursive: rsync counts every file first, so the progress line's percentage is of the whole.
PROGRESS_FLAGS = ("--info=progress2", "--no-inc-recursive")


@dataclass(frozen=True)
class NodeSource:
    """One node's project folder, as a pull reads it."""

    name: str
    transport: Transport
    workdir: str  # ssh: relative to the login's home unless absolute; shared files: this project

    def describe(self) -> str:
        return self.transport.describe()


@dataclass(frozen=True)
class Fetched:
    """One path pulled: from which node, where it landed, its size there."""

    node: str
    path: str
    dest: Path
    size: int
    replaced: bool = False  # a local copy was there and is now the node's
    here: bool = False  # the node shares this machine's files: the path is the destination itself

    def line(self, root: Path) -> str:
        where = self.dest.relative_to(root) if self.dest.is_relative_to(root) else self.dest
        if self.here:
            return f"{self.path} ({human_size(self.size)}) is here already: {self.node} shares this machine's files"
        what = "replacing the earlier copy" if self.replaced else "new"
        return f"pulled {self.path} ({human_size(self.size)}) from {self.node} into {where} ({what})"


def sources_of(cluster: Cluster) -> list[NodeSource]:
    """Every node of a deployed cluster, in node order."""
    project, outputs, transports = cluster.project, cluster.outputs, cluster.transports()
    return [NodeSource(node.name, t, str(project.root) if t.shares_fs else node_workdir(outputs, node))
            for node, t in zip(outputs.nodes, transports, strict=True)]


def source_of_run(node: NodeRun) -> NodeSource:
    """A run's node, with the project folder the run used there."""
    return NodeSource(node.name, node.transport, node.plan.workdir)


def size_step(source: NodeSource, rel: str) -> Step:
    """The node program's step that measures `rel` in the node's project folder (`callsteps.size`)."""
    return Step("callsteps.size", (rel,), source.workdir, NODE_CHECKS)


def ask_sizes(sources: list[NodeSource], rels: list[str]) -> None:
    """Measure every path on every node in one call per node, before the copies (each `measure`
    then takes its answer)."""
    if rels:
        fan_out(lambda s: ask_ahead(s.transport, [size_step(s, rel) for rel in rels], MEASURE_TIMEOUT_S), sources)


def measure(source: NodeSource, rel: str) -> int:
    """Bytes of `rel` on the node. A FatpipeError naming the node and the path when it is not
    there, or resolves (links followed) outside the project folder."""
    try:
        answer = answer_of(source.transport, size_step(source, rel), MEASURE_TIMEOUT_S)
    except NodeCallError as e:
        raise FatpipeError(f"{source.describe()}: cannot pull {rel}: {e.reason}") from None
    size, why = step_value(answer, f"cannot pull {rel}", source.transport)
    if size is None:
        raise FatpipeError(f"{source.describe()}: {why}")
    return int(size)


def copy_from_node(source: NodeSource, rel: str, dest: Path, replace: bool = False,
              progress: Progress | None = None) -> Fetched:
    """Copy `rel` (a file or folder, `infra.runspec.pull_path`'s form) from the node's project
    folder to `dest`; a FatpipeError in one line, with `dest` as it was, when it cannot."""
    dest = Path(dest).absolute()
    here = source.transport.shares_fs and Path(source.workdir, rel).resolve() == dest.resolve()
    if os.path.lexists(dest) and not (replace or here):
        raise FatpipeError(f"{dest} exists; --force replaces it with {rel} from {source.name}")
    size = measure(source, rel)  # not there, or outside the project folder: refused before any copy
    if here:
        return Fetched(source.name, rel, dest, size, here=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    name = PurePosixPath(rel).name
    partial, why = into_partial(dest.parent, source.name, lambda folder: copy(source, rel, folder, progress), name)
    if partial is None:
        raise FatpipeError(f"{source.describe()}: could not pull {rel} ({why}); {dest} is as it was")
    try:
        replaced = swap_into_place(partial / name, dest, replace)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return Fetched(source.name, rel, dest, size, replaced=replaced)


def copy(source: NodeSource, rel: str, folder: Path, progress: Progress | None) -> Result:
    """rsync `rel` from the node into `folder` (as `folder/<its name>`); over ssh as every
    transfer of the node goes (`-s`, values as arguments), else a local copy."""
    t = source.transport
    if t.shares_fs:
        argv = ["rsync", "-a", *PROGRESS_FLAGS, "--", f"{source.workdir}/{rel}", f"{folder}/"]
    else:
        argv = t.rsync_argv(f"{t.remote_host()}:{source.workdir}/{rel}", f"{folder}/", PROGRESS_FLAGS)
    return rsync_with_progress(argv, progress)


def rsync_with_progress(argv: list[str], progress: Progress | None) -> Result:
    """Run rsync, handing each of its progress lines to `progress`; a Ctrl-C kills it."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=True)
        try:
            pending = b""
            while chunk := proc.stdout.read1(4096):
                *lines, pending = re.split(rb"[\r\n]", pending + chunk)  # progress2 rewrites its line with \r
                for line in filter(None, (raw.decode(errors="replace").strip() for raw in lines)):
                    if progress:
                        progress(line)
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stdout.close()
        err.seek(0)
        return Result(proc.returncode, "", err.read().decode(errors="replace"))


def swap_into_place(new: Path, dest: Path, replace: bool) -> bool:
    """Rename `new` to `dest`; an existing `dest` (only when `replace`) is moved aside first and
    removed once the new one is in place. Whether one was replaced."""
    if not os.path.lexists(dest):
        os.rename(new, dest)
        return False
    if not replace:
        raise FatpipeError(f"{dest} appeared during the pull; it is left as it is")
    aside = Path(tempfile.mkdtemp(prefix=f"{PULL_PREFIX}old-", dir=dest.parent))
    os.rename(dest, aside / dest.name)
    try:
        os.rename(new, dest)
    except OSError:
        os.rename(aside / dest.name, dest)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    return True


def pull_declared(project, node: NodeSource) -> list[tuple[bool, str]]:
    """`[run] pull` from node 0 into the same paths here, each replacing the earlier copy:
    (pulled, one line with its size or why not) per path. A failure is said, never raised: the
    run's own outcome stands."""
    said = []
    ask_sizes([node], list(project.spec.run.pull))
    for rel in project.spec.run.pull:
        try:
            said.append((True, copy_from_node(node, rel, project.root / rel, replace=True).line(project.root)))
        except FatpipeError as e:
            said.append((False, str(e)))
    return said
