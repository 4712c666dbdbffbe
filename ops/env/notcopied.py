"""Why a file a worker could not find on an ssh node is missing there, when it exists here.

The project copy (ops.run.prepare, through the transport's rsync) leaves out what fatpipe never ships
(SYNC_EXCLUDES) and what the project's .gitignore files leave out, and it copies nothing outside
the project folder. The verdict comes from rsync itself, asked with the same rules in a dry run
for that one path, so it cannot disagree with the copy.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from ..reach.transport import GITIGNORE_FILTER
from .shipped import SYNC_EXCLUDES

HOW_TO_SEND = "send it with a [data] section in fatpipe.toml"


def _copied(root: Path, rel: PurePosixPath, excludes: tuple[str, ...], gitignore: bool) -> bool:
    """Whether rsync, with these rules, would copy `rel` (a path below `root`)."""
    parts = rel.parts
    walk = [f"--include=/{'/'.join(parts[:i])}/" for i in range(1, len(parts))]
    rules = [f"--exclude={p}" for p in excludes] + ([GITIGNORE_FILTER] if gitignore else [])
    with tempfile.TemporaryDirectory(prefix="fatpipe-copied-") as dest:
        done = subprocess.run(
            ["rsync", "-n", "-r", "--out-format=%n", *rules, *walk, f"--include=/{rel.as_posix()}",
             "--exclude=*", f"{root}/", f"{dest}/"],
            capture_output=True, text=True, timeout=60)
    return done.returncode == 0 and rel.as_posix() in {line.rstrip("/") for line in done.stdout.splitlines()}


def project_path(filename: str, root: Path, workdir: str) -> Path:
    """The file on this machine that the worker's path means: relative to the project folder,
    which is the worker's folder on the node (`workdir`), or absolute."""
    path = PurePosixPath(filename)
    marker = PurePosixPath(workdir)
    if path.is_absolute() and marker.parts and marker.as_posix() in path.as_posix():
        # An absolute path into the project's copy on the node: the same file in the project.
        path = PurePosixPath(path.as_posix().split(marker.as_posix(), 1)[1].lstrip("/"))
    return (root / path).resolve() if not path.is_absolute() else Path(path)


def not_copied_hint(filename: str, root: Path, workdir: str) -> str | None:
    """Why `filename` (as a worker on an ssh node named it) is missing there, and how to send
    it; None when it does not exist here either, or was copied."""
    root = Path(root).resolve()
    local = project_path(filename, root, workdir)
    if not local.exists():
        return None
    try:
        rel = PurePosixPath(local.relative_to(root).as_posix())
    except ValueError:
        return (f"{local} exists on this machine but lies outside the project folder, which is all "
                f"fatpipe copies to the nodes; {HOW_TO_SEND}")
    if not _copied(root, rel, SYNC_EXCLUDES, gitignore=False):
        return (f"{rel} exists here but fatpipe never copies it (it excludes "
                f"{', '.join(SYNC_EXCLUDES)}); {HOW_TO_SEND}")
    if not _copied(root, rel, SYNC_EXCLUDES, gitignore=True):
        return (f"{rel} exists here but was not copied to the nodes: it is git-ignored, and the "
                f"project copy honours .gitignore; {HOW_TO_SEND}")
    return None
