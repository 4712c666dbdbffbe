"""The hashes of files that did not change since they were last read: a no-change push does not re-read the data.

A small JSON file kept with the manifest (the operator's beside its copy of the manifest, a node's
beside the staged data) maps a file's absolute path to its stat identity (size, mtime_ns, ctime_ns,
inode) and its sha256 and chunk hashes. Any change of that identity re-hashes the file: writing
into a file moves its mtime and ctime, replacing it changes its inode, and ctime cannot be set
back by hand the way mtime can. Pure Python, like `manifest`. docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

VERSION = 1
CACHE_SUFFIX = ".fatpipe-hashes.json"  # a node's cache: beside the data's manifest, named like it
# A file changed less than this long before it was read may change again within the same
# timestamp tick, keeping its identity: its hashes are not kept (git's "racy" files).
RACY_NS = 1_000_000_000


def identity(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


class HashCache:
    """Hashes by path, valid while the file's stat identity and the chunk size stay the same."""

    def __init__(self, path: Path, chunk_size: int):
        self.path, self.chunk_size, self.dirty = Path(path), chunk_size, False
        self.files: dict[str, dict] = {}
        try:
            if self.path.is_symlink():  # planted: never read through it (save replaces it)
                return
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: start afresh
            return
        if isinstance(saved, dict) and saved.get("version") == VERSION and saved.get("chunk_size") == chunk_size:
            self.files = saved.get("files") or {}

    def hashes(self, path: Path, hasher) -> tuple[str, list[str]]:
        """(sha256, chunk hashes) of a whole file: from the cache while it is unchanged, else `hasher(path)`."""
        key = str(Path(path).absolute())
        before = identity(os.stat(path))
        known = self.files.get(key)
        if known and known.get("stat") == before:
            return known["sha256"], known["chunks"]
        sha, chunks = hasher(path)
        settled = time.time_ns() - before[2] > RACY_NS
        if settled and identity(os.stat(path)) == before:  # and not written to while it was read
            self.remember(path, sha, chunks, before)
        return sha, chunks

    def remember(self, path: Path, sha: str, chunks: list[str], stat_identity: list[int] | None = None) -> None:
        """Record the hashes of a file known to be whole (one just verified and renamed into place)."""
        stamp = stat_identity or identity(os.stat(path))
        self.files[str(Path(path).absolute())] = {"stat": stamp, "sha256": sha, "chunks": chunks}
        self.dirty = True

    def save(self) -> None:
        """Write the cache if it changed (temporary file, then rename); a cache that cannot be written is skipped."""
        if not self.dirty:
            return
        live = {k: v for k, v in self.files.items() if os.path.isfile(k)}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
            # O_EXCL: a link planted at the temporary name is never followed.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"version": VERSION, "chunk_size": self.chunk_size, "files": live}))
            os.replace(tmp, self.path)
            self.dirty = False
        except OSError:
            tmp.unlink(missing_ok=True)
