"""A staged dataset's manifest: size and sha256 per file and per chunk, made and checked by streaming.

The format is docs/ARCHITECTURE.md, "The data contract". Pure Python (hashlib): the operator's
machine builds it and every node checks against it, with no torch. Memory stays at one read
buffer whatever the file size; a `HashCache` skips re-reading files that did not change. `python -m
fatpipe.trainer.staging.check` is a node's check against it. Every name becomes a path through
`file_target`, which refuses one that is not a plain relative path (`names`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fatpipe.trainer.staging.hashcache import CACHE_SUFFIX, HashCache
from fatpipe.trainer.staging.names import (
    UnsafeName,
    check_name,
    check_names,
    data_path,
    dataset_base,
    first_link,
    open_nofollow,
    writable_target,
)

VERSION = 1
MANIFEST_NAME = ".fatpipe-manifest.json"  # infra.dataspec keeps the same name
PARTIAL_SUFFIX = ".fatpipe-partial"  # a file being received; renamed once its hash matches
RECORD_NAME = ".fatpipe-staged.json"  # what fatpipe wrote there (`record`): the only files a push may delete
READ_SIZE = 1 << 20


def chunk_count(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def hash_file(path: Path, chunk_size: int, limit: int | None = None) -> tuple[str, list[str]]:
    """(sha256 of the file, sha256 of each chunk), read in 1 MiB pieces; `limit` bytes at most."""
    whole, chunks = hashlib.sha256(), []
    part, in_part = hashlib.sha256(), 0
    left = limit if limit is not None else -1
    with open(path, "rb") as f:
        while left != 0:
            want = READ_SIZE if left < 0 else min(READ_SIZE, left)
            block = f.read(min(want, chunk_size - in_part))
            if not block:
                break
            whole.update(block)
            part.update(block)
            in_part += len(block)
            left = left - len(block) if left > 0 else left
            if in_part == chunk_size:
                chunks.append(part.hexdigest())
                part, in_part = hashlib.sha256(), 0
    if in_part:
        chunks.append(part.hexdigest())
    return whole.hexdigest(), chunks


class ChunkCheck:
    """The sha256 of each chunk a node receives, fed piece by piece as they arrive (a chunk's pieces
    come in order), so a received file is checked without reading it again."""

    def __init__(self, manifest: dict):
        self.manifest, self.running, self.good = manifest, {}, set()

    def feed(self, f: int, offset: int, data) -> None:
        size, entry = self.manifest["chunk_size"], self.manifest["files"][f]
        c = offset // size
        running = self.running.setdefault((f, c), hashlib.sha256())
        running.update(data)
        if offset + len(data) == min((c + 1) * size, entry["size"]):  # the chunk's last piece
            del self.running[(f, c)]
            if running.hexdigest() == entry["chunks"][c]:
                self.good.add((f, c))


def data_files(source: Path) -> list[tuple[str, Path]]:
    """(name in the manifest, path) of every file of a folder, sorted; a file source is itself.

    A link anywhere in the folder is refused (UnsafeName): copied as a link it would lead a node's
    reads and writes wherever it points; so is a name that is not a plain path (a newline, ...)."""
    source = Path(source)
    if source.is_file():
        return [(check_name(source.name, f"the data source {source}"), source)]
    found = []
    for folder, dirs, files in os.walk(source):
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink():
                raise UnsafeName(f"data source {source}: {path.relative_to(source).as_posix()} is a symbolic link "
                                 f"(to {os.readlink(path)}); fatpipe copies no links: put the file itself there")
        for name in files:
            path = Path(folder) / name
            own = name in (MANIFEST_NAME, RECORD_NAME) or name.endswith((PARTIAL_SUFFIX, CACHE_SUFFIX))
            if own or not path.is_file():
                continue
            found.append((path.relative_to(source).as_posix(), path))
    check_names([name for name, _ in found], f"the data source {source}")
    return sorted(found)


def build_manifest(source: Path, chunk_size: int, path: str, cache: HashCache | None = None) -> dict:
    """The manifest of a local file or folder; files `cache` knows unchanged are not read again."""
    files = []
    for name, file in data_files(source):
        sha, chunks = _hashes(file, chunk_size, cache)
        stat = file.stat()
        files.append({"name": name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha,
                      "chunks": chunks})
    return manifest_of("file" if Path(source).is_file() else "folder", path, chunk_size, files)


def manifest_of(kind: str, path: str, chunk_size: int, files: list[dict]) -> dict:
    """The manifest of `files` (each with name, size, sha256, chunks), fingerprinted."""
    fingerprint = hashlib.sha256("".join(f"{f['name']}\0{f['sha256']}\n" for f in files).encode())
    return {"version": VERSION, "kind": kind, "path": path, "chunk_size": chunk_size,
            "total_bytes": sum(f["size"] for f in files), "fingerprint": fingerprint.hexdigest(), "files": files}


def _hashes(path: Path, chunk_size: int, cache: HashCache | None) -> tuple[str, list[str]]:
    def read(p: Path) -> tuple[str, list[str]]:
        return hash_file(p, chunk_size)

    return cache.hashes(path, read) if cache is not None else read(path)


def file_target(manifest: dict, root: Path, name: str) -> Path:
    """Where a manifest file lives under `root` (the project folder); UnsafeName for a name that
    is not a plain relative path (`names`)."""
    base = data_path(manifest, root)
    return base if manifest["kind"] == "file" else base / check_name(name, "the manifest")


def manifest_target(manifest: dict, root: Path) -> Path:
    """Where the manifest is kept with the data: inside a folder, beside a single file."""
    base = data_path(manifest, root)
    return base / MANIFEST_NAME if manifest["kind"] == "folder" else base.with_name(base.name + MANIFEST_NAME)


def node_cache(manifest: dict, root: Path) -> HashCache:
    """A node's hash cache, kept beside the data's manifest."""
    base = data_path(manifest, root)
    path = base / CACHE_SUFFIX if manifest["kind"] == "folder" else base.with_name(base.name + CACHE_SUFFIX)
    return HashCache(path, manifest["chunk_size"])


def held_chunks(manifest: dict, root: Path, entry: dict, cache: HashCache | None = None) -> list[bool]:
    """Which of a file's chunks this node holds right: from the file, else from its partial copy."""
    target = file_target(manifest, root, entry["name"])
    want = entry["chunks"]
    base = dataset_base(manifest, root)
    if first_link(base, target) or first_link(base, target.with_name(target.name + PARTIAL_SUFFIX)):
        return [False] * len(want)  # a link is no data: the copy written replaces it
    for path in (target, target.with_name(target.name + PARTIAL_SUFFIX)):
        if path == target and path.is_file() and path.stat().st_size == entry["size"]:
            _, have = _hashes(path, manifest["chunk_size"], cache)  # a whole file: the cache may know it
            return [i < len(have) and have[i] == sha for i, sha in enumerate(want)]
        if path.is_file():
            _, have = hash_file(path, manifest["chunk_size"], limit=entry["size"])
            return [i < len(have) and have[i] == sha for i, sha in enumerate(want)]
    return [False] * len(want)


def first_difference(manifest: dict, root: Path, cache: HashCache | None = None) -> str | None:
    """The first file that differs from the manifest, as `<path>/<file>: why`; None when all match.

    With a `cache`, files it knows unchanged since they were hashed are not read again."""
    for entry in manifest["files"]:
        target = file_target(manifest, root, entry["name"])
        shown = f"{manifest['path']}/{entry['name']}" if manifest["kind"] == "folder" else manifest["path"]
        link = first_link(dataset_base(manifest, root), target)
        if link is not None:
            return f"{link.relative_to(root).as_posix()}: a symbolic link, which fatpipe never reads data through"
        if not target.is_file():
            return f"{shown}: missing"
        size = target.stat().st_size
        if size != entry["size"]:
            return f"{shown}: {size} bytes, the manifest says {entry['size']}"
        sha, chunks = _hashes(target, manifest["chunk_size"], cache)
        if sha != entry["sha256"]:
            # zip without strict=: nodes may run Python 3.8; a shorter list is the size's difference
            bad = next((i for i, (a, b) in enumerate(zip(chunks, entry["chunks"])) if a != b), 0)  # noqa: B905
            return f"{shown}: chunk {bad} differs from the manifest (sha256)"
    return None


def write_manifest(manifest: dict, root: Path) -> Path:
    """Keep the manifest with the data (temporary file, then rename)."""
    target = writable_target(dataset_base(manifest, root), manifest_target(manifest, root))
    tmp = target.with_name(target.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL) as f:
        f.write((json.dumps(manifest, indent=1) + "\n").encode())
    os.replace(tmp, target)
    return target
