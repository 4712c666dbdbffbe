"""A staged folder is exactly its manifest: what it holds beyond the listed files is named, and a push removes it.

The dataset folder on a node is fatpipe's alone (docs/ARCHITECTURE.md, "The data contract"):
besides the listed files it keeps only its own (the manifest, the hash cache, a listed file's
partial copy). Anything else is an extra: a shard a re-tokenised dataset dropped, a file put
there by hand, a link (even at a listed name: a link is never data). `data verify` and `launch`
name extras, a push removes them (a link itself, never what it points to). A single staged file
shares its folder with others: nothing there is extra.
"""

from __future__ import annotations

import os
from pathlib import Path

from fatpipe.trainer.staging.hashcache import CACHE_SUFFIX
from fatpipe.trainer.staging.manifest import MANIFEST_NAME, PARTIAL_SUFFIX
from fatpipe.trainer.staging.names import data_path

SHOWN = 5  # extras named in one line; the rest counted


def kept_names(manifest: dict) -> set[str]:
    """Every name the folder may hold: the listed files, their partial copies, fatpipe's own files."""
    listed = {f["name"] for f in manifest["files"]}
    own = {MANIFEST_NAME, CACHE_SUFFIX, MANIFEST_NAME + ".tmp", CACHE_SUFFIX + ".tmp"}
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


def prune(manifest: dict, root: Path) -> list[str]:
    """Remove every extra (a link itself, never its target), then the folders that held only
    extras; the extras' names."""
    base = data_path(manifest, root)
    removed = extra_files(manifest, root)
    for name in removed:
        (base / name).unlink(missing_ok=True)
    needed = {"/".join(f["name"].split("/")[:i]) for f in manifest["files"] for i in range(1, f["name"].count("/") + 1)}
    emptied = {"/".join(n.split("/")[:i]) for n in removed for i in range(1, n.count("/") + 1)} - needed
    for folder in sorted(emptied, key=lambda f: -f.count("/")):  # the deepest first
        try:
            (base / folder).rmdir()
        except OSError:  # not empty: it holds something else too (an empty folder of its own)
            pass
    return removed


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
