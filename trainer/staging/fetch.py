"""The node side of a remote [data] source: each node fetches it over its own link.

    python -m fatpipe.trainer.staging.fetch SPEC PROJECT_FOLDER [--own]

SPEC is the JSON `ops.data.fetch` ships (source, path, chunk_size and the source's keys, a
`ca_bundle` relative to SPEC's folder; never a credential). The node lists the source (S3: every
object under the prefix; https: the one file) with sizes and ETags, keeps a file whose size and ETag
match its last fetch and whose sha256 still matches, and streams the others 1 MiB at a time into
`<file>.fatpipe-partial`, renamed when complete. A partial copy whose ETag (kept in
`<file>.fatpipe-partial.etag`) still matches is resumed from its end (a Range request, an S3 ranged
GET); a dropped connection is retried the same way. A file fatpipe did not stage where a file lands
stops the fetch before anything is written, and only what fatpipe staged there goes when the source
no longer lists it (`record`; `--own`: the project folder is fatpipe's, an ssh node's). The node
then hashes every file and writes the manifest beside the data (docs/ARCHITECTURE.md, "The data
contract"). Prints `FETCH_PROGRESS <held> <total> <fetched>` as it goes, then `FETCH_JSON
<manifest>`, or `FETCH_ERROR <one line>` and exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .fetch_http import HttpSource
from .fetch_s3 import S3Source
from .fetch_types import FetchError, Remote
from .manifest import (
    PARTIAL_SUFFIX,
    file_target,
    hash_file,
    manifest_of,
    manifest_target,
    write_manifest,
)
from .names import (
    UnsafeName,
    check_manifest,
    dataset_base,
    first_link,
    name_problem,
    open_nofollow,
    writable_target,
)
from .record import InTheWay, Staged, make_room

RESULT_PREFIX, PROGRESS_PREFIX, ERROR_PREFIX = "FETCH_JSON ", "FETCH_PROGRESS ", "FETCH_ERROR "
ATTEMPTS = 5  # reads of one file, each resuming where the last stopped
RETRY_PAUSE_S = 1.0
PROGRESS_EVERY_S = 0.5
TAG_SUFFIX = PARTIAL_SUFFIX + ".etag"


class Progress:
    def __init__(self, total: int):
        self.total, self.held, self.fetched, self.last = total, 0, 0, 0.0

    def add(self, n: int, fetched: bool) -> None:
        self.held += n
        self.fetched += n if fetched else 0
        if time.monotonic() - self.last > PROGRESS_EVERY_S or self.held == self.total:
            self.last = time.monotonic()
            print(f"{PROGRESS_PREFIX}{self.held} {self.total} {self.fetched}", flush=True)


def open_source(spec: dict, root: Path):
    if spec["source"].startswith("s3://"):
        return S3Source(spec, root)
    return HttpSource(spec, root)


def previous_entries(manifest: dict, root: Path) -> dict[str, dict]:
    """What this node's last fetch recorded beside the data, by file name (empty if none, or a link)."""
    try:
        if manifest_target(manifest, root).is_symlink():
            return {}
        last = json.loads(manifest_target(manifest, root).read_text())
    except (OSError, ValueError):
        return {}
    same = last.get("source") == manifest["source"] and last.get("chunk_size") == manifest["chunk_size"]
    return {f["name"]: f for f in last.get("files", [])} if same else {}


def held_entry(remote: Remote, target: Path, old: dict | None, chunk_size: int, base: Path) -> dict | None:
    """The manifest entry of a file this node already holds right, else None (a link is no file)."""
    if old is None or (old.get("size"), old.get("etag")) != (remote.size, remote.etag):
        return None
    if first_link(base, target) is not None or not target.is_file() or target.stat().st_size != remote.size:
        return None
    sha, chunks = hash_file(target, chunk_size)
    return entry(remote, sha, chunks) if sha == old.get("sha256") else None


def entry(remote: Remote, sha: str, chunks: list[str]) -> dict:
    return {"name": remote.name, "size": remote.size, "etag": remote.etag, "sha256": sha, "chunks": chunks}


def resume_point(remote: Remote, part: Path, tag: Path) -> int:
    """Where the partial copy continues: its end, when it holds the same ETag's bytes; else 0.
    Both lie in the dataset folder with no link on their way (`fetch_file`)."""
    if part.is_file() and tag.is_file() and tag.read_text() == remote.etag:
        size = part.stat().st_size
        if size <= remote.size:
            return size
    for path, data in ((part, b""), (tag, remote.etag.encode())):
        with open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as f:
            f.write(data)
    return 0


def fetch_file(source, remote: Remote, target: Path, progress: Progress, base: Path) -> None:
    """Stream one file into its partial copy (resuming, retrying), then rename it into place."""
    part = writable_target(base, target.with_name(target.name + PARTIAL_SUFFIX))
    tag = writable_target(base, target.with_name(target.name + TAG_SUFFIX))
    writable_target(base, target)  # a link at the file's own name is removed, not followed
    offset = resume_point(remote, part, tag)
    progress.add(offset, fetched=False)
    problem = None
    for attempt in range(ATTEMPTS):
        if offset >= remote.size:
            break
        try:
            start, blocks = source.read(remote, offset)
            with open_nofollow(part, os.O_RDWR) as f:
                f.truncate(start)
                f.seek(start)
                progress.add(start - offset, fetched=False)  # negative: the server sent it whole
                offset = start
                for block in blocks:
                    f.write(block)
                    offset += len(block)
                    progress.add(len(block), fetched=True)
        except (FetchError, UnsafeName, BrokenPipeError):  # BrokenPipeError: the operator went away (Ctrl-C)
            raise
        except Exception as e:  # noqa: BLE001 - a dropped or stalled connection: resume from the partial copy
            problem = f"{type(e).__name__}: {e}"
            time.sleep(RETRY_PAUSE_S * (attempt + 1))
            offset = part.stat().st_size
    if offset != remote.size or part.stat().st_size != remote.size:
        why = f" ({problem})" if problem else ""
        raise FetchError(f"{remote.name}: {offset} of {remote.size} bytes came{why}; run the push again: "
                         "it resumes")
    os.replace(part, target)
    tag.unlink(missing_ok=True)


def fetch(spec: dict, root: Path, own: bool = False) -> dict:
    """Fetch what this node lacks; returns the manifest of what it holds. `own`: the project
    folder is fatpipe's (an ssh node's), else a folder of the user's (`record`)."""
    source = open_source(spec, root)
    kind, remotes = source.listing()
    # Every name checked before anything is written: a hostile key names one line and writes nothing.
    for remote in remotes:
        problem = name_problem(remote.name)
        if problem:
            raise UnsafeName(f"unsafe key {remote.key!r} in {spec['source']}: {problem}; nothing was written")
    shell = check_manifest({"kind": kind, "path": spec["path"], "chunk_size": spec["chunk_size"],
                            "source": spec["source"], "files": [{"name": r.name} for r in remotes]}, spec["source"])
    base = dataset_base(shell, root)
    # Nothing of the user's is written over; what fatpipe staged and the source no longer lists goes.
    removed = make_room(shell, root, Staged.begin(shell, root, own))
    old = previous_entries(shell, root)
    progress = Progress(sum(r.size for r in remotes))
    files = []
    for remote in remotes:
        target = file_target(shell, root, remote.name)
        kept = held_entry(remote, target, old.get(remote.name), spec["chunk_size"], base)
        if kept is None:
            fetch_file(source, remote, target, progress, base)
            kept = entry(remote, *hash_file(target, spec["chunk_size"]))
        else:
            progress.add(remote.size, fetched=False)
        files.append(kept)
    manifest = {**manifest_of(kind, spec["path"], spec["chunk_size"], files), "source": spec["source"],
                "fetched_bytes": progress.fetched, "removed": removed}
    write_manifest(manifest, root)
    return manifest


def main(argv: list[str]) -> int:
    own = argv[2:] == ["--own"]
    if len(argv) - own != 2:
        print("usage: python -m fatpipe.trainer.staging.fetch SPEC PROJECT_FOLDER [--own]", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(argv[0]).read_text())
        if spec.get("ca_bundle"):  # shipped beside the spec
            spec["ca_bundle"] = str((Path(argv[0]).parent / spec["ca_bundle"]).resolve())
        manifest = fetch(spec, Path(argv[1]), own)
    except (FetchError, UnsafeName, InTheWay) as e:
        print(ERROR_PREFIX + " ".join(str(e).split()), flush=True)
        return 1
    except Exception as e:  # noqa: BLE001 - unreachable source, full disk: one line for the operator
        print(ERROR_PREFIX + f"{type(e).__name__}: " + " ".join(str(e).split()), flush=True)
        return 1
    print(RESULT_PREFIX + json.dumps(manifest), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
