"""A staged dataset's manifest: size and sha256 per file and per chunk, made and checked by streaming.

The format is docs/ARCHITECTURE.md, "The data contract". Pure Python (hashlib): the operator's
machine builds it and every node checks against it, with no torch. Memory stays at one read
buffer whatever the file size; a `HashCache` skips re-reading files that did not change. `python -m
fatpipe.trainer.staging.manifest check [--rehash] MANIFEST ROOT` prints the first difference as one line and exits 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from fatpipe.trainer.staging.hashcache import CACHE_SUFFIX, HashCache

VERSION = 1
MANIFEST_NAME = ".fatpipe-manifest.json"  # infra.dataspec keeps the same name
PARTIAL_SUFFIX = ".fatpipe-partial"  # a file being received; renamed once its hash matches
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
    """(name in the manifest, path) of every file of a folder, sorted; a file source is itself."""
    source = Path(source)
    if source.is_file():
        return [(source.name, source)]
    found = []
    for folder, _dirs, files in os.walk(source):
        for name in files:
            path = Path(folder) / name
            if name == MANIFEST_NAME or name.endswith((PARTIAL_SUFFIX, CACHE_SUFFIX)) or not path.is_file():
                continue
            found.append((path.relative_to(source).as_posix(), path))
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
    """Where a manifest file lives under `root` (the project folder)."""
    base = Path(root) / manifest["path"]
    return base if manifest["kind"] == "file" else base / name


def manifest_target(manifest: dict, root: Path) -> Path:
    """Where the manifest is kept with the data: inside a folder, beside a single file."""
    base = Path(root) / manifest["path"]
    return base / MANIFEST_NAME if manifest["kind"] == "folder" else base.with_name(base.name + MANIFEST_NAME)


def node_cache(manifest: dict, root: Path) -> HashCache:
    """A node's hash cache, kept beside the data's manifest."""
    base = Path(root) / manifest["path"]
    path = base / CACHE_SUFFIX if manifest["kind"] == "folder" else base.with_name(base.name + CACHE_SUFFIX)
    return HashCache(path, manifest["chunk_size"])


def held_chunks(manifest: dict, root: Path, entry: dict, cache: HashCache | None = None) -> list[bool]:
    """Which of a file's chunks this node holds right: from the file, else from its partial copy."""
    target = file_target(manifest, root, entry["name"])
    want = entry["chunks"]
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
        if not target.is_file():
            return f"{shown}: missing"
        size = target.stat().st_size
        if size != entry["size"]:
            return f"{shown}: {size} bytes, the manifest says {entry['size']}"
        sha, chunks = _hashes(target, manifest["chunk_size"], cache)
        if sha != entry["sha256"]:
            bad = next((i for i, (a, b) in enumerate(zip(chunks, entry["chunks"], strict=False)) if a != b), 0)
            return f"{shown}: chunk {bad} differs from the manifest (sha256)"
    return None


def write_manifest(manifest: dict, root: Path) -> Path:
    """Keep the manifest with the data (temporary file, then rename)."""
    target = manifest_target(manifest, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, target)
    return target


def main(argv: list[str]) -> int:
    rehash = "--rehash" in argv[1:2]  # read every file again, whatever the cache says
    argv = [a for i, a in enumerate(argv) if not (i == 1 and rehash)]
    if len(argv) != 3 or argv[0] != "check":
        print("usage: python -m fatpipe.trainer.staging.manifest check [--rehash] MANIFEST PROJECT_FOLDER", file=sys.stderr)
        return 2
    manifest, root = json.loads(Path(argv[1]).read_text()), Path(argv[2])
    cache = node_cache(manifest, root)
    if rehash:
        cache.files.clear()
    problem = first_difference(manifest, root, cache)
    cache.save()
    if problem:
        print(problem)
        return 1
    print(f"ok {manifest['fingerprint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
