"""What a staged folder holds beyond its manifest: named by the check, removed by a push when fatpipe staged it.

Besides the listed files a dataset folder keeps fatpipe's own (the manifest, the hash cache, the
record of what it staged, a listed file's partial copy). Anything else is an extra: a shard a
re-tokenised dataset dropped, a file put there by hand, a link (even at a listed name: a link is
never data). A push removes an extra only when fatpipe staged it there (`record`): every extra
in a folder fatpipe claimed, which stays exactly its manifest (docs/ARCHITECTURE.md, "The data
contract"); in a folder of the user's only what the record names, nothing without one. `data
verify` and `launch` name what a push would remove; a push removes a link itself, never what it
points to. A single staged file shares its folder with others: nothing there is extra.
"""

from __future__ import annotations

import os
from pathlib import Path

from fatpipe.trainer.staging.hashcache import CACHE_SUFFIX
from fatpipe.trainer.staging.manifest import MANIFEST_NAME, PARTIAL_SUFFIX, RECORD_NAME
from fatpipe.trainer.staging.names import data_path

SHOWN = 5  # extras named in one line; the rest counted


def kept_names(manifest: dict) -> set[str]:
    """Every name the folder may hold: the listed files, their partial copies, fatpipe's own files."""
    listed = {f["name"] for f in manifest["files"]}
    own = {MANIFEST_NAME, CACHE_SUFFIX, RECORD_NAME} | {n + ".tmp" for n in (MANIFEST_NAME, CACHE_SUFFIX, RECORD_NAME)}
    return listed | own | {n + PARTIAL_SUFFIX for n in listed} | {n + PARTIAL_SUFFIX + ".etag" for n in listed}


def extra_files(manifest: dict, root: Path) -> list[str]:
    """Names (relative to the folder) of the files and links it holds beyond its manifest, sorted.
    Links are not followed; a folder is no extra by itself (an empty one holds no data)."""
    if manifest["kind"] != "folder":
        return []
    base = data_path(manifest, root)
    if not base.is_dir():
        return []
    keep, extra = kept_names(manifest), []
    for folder, dirs, files in os.walk(base):  # followlinks=False: a link to a folder is listed, not entered
        rel = Path(folder).relative_to(base)
        for name in list(dirs):
            if (Path(folder) / name).is_symlink():
                extra.append((rel / name).as_posix())
                dirs.remove(name)
        extra += [(rel / name).as_posix() for name in files
                  if (rel / name).as_posix() not in keep or (Path(folder) / name).is_symlink()]
    return sorted(extra)


def removable(manifest: dict, root: Path, staged) -> list[str]:
    """The extras a push removes: those `staged` (the folder's `record.Staged`; None: no record,
    nothing) says fatpipe staged there, every one in a folder it claimed."""
    return [] if staged is None else [n for n in extra_files(manifest, root) if staged.owns(n)]


def prune(manifest: dict, root: Path, staged) -> tuple[list[str], list[str]]:
    """Remove the extras fatpipe staged (a link itself, never its target), then the folders that
    held only those and that fatpipe made; (the extras' names, the folders')."""
    base = data_path(manifest, root)
    removed = removable(manifest, root, staged)
    for name in removed:
        (base / name).unlink(missing_ok=True)
    needed = {"/".join(f["name"].split("/")[:i]) for f in manifest["files"] for i in range(1, f["name"].count("/") + 1)}
    emptied = {"/".join(n.split("/")[:i]) for n in removed for i in range(1, n.count("/") + 1)} - needed
    gone = []
    for folder in sorted(emptied, key=lambda f: -f.count("/")):  # the deepest first
        try:
            if staged.owns_folder(folder):
                (base / folder).rmdir()
                gone.append(folder)
        except OSError:  # not empty: it holds something else too (an empty folder of its own)
            pass
    return removed, gone


def name_list(names: list[str]) -> str:
    """The first few names, on one line whatever they hold, and how many more."""
    shown = ", ".join(n if n.isprintable() else ascii(n) for n in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def describe_extras(manifest: dict, extras: list[str]) -> str:
    """`data/set holds 3 file(s) the manifest does not list: a, b, c`."""
    return f"{manifest['path']} holds {len(extras)} file(s) the manifest does not list: {name_list(extras)}"


def describe_removed(manifest: dict, removed: list[str]) -> str:
    """`removed 2 file(s) the manifest does not list from data/set: a.bin, b.bin` (a push)."""
    return f"removed {len(removed)} file(s) the manifest does not list from {manifest['path']}: {name_list(removed)}"
