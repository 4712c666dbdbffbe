"""Every name that becomes a file under a dataset folder is checked here, wherever it came from.

An S3 key, an https file's name, a manifest entry (the operator's copy, a node's, one read from
disk or received by the chain) or a file of a local source: a plain relative POSIX path, or
`UnsafeName` in one line naming it and its source, before anything is written. And the final
path: no symbolic link between the dataset folder and the file, and the resolved path inside the
resolved folder, so neither a hostile name nor a planted link moves a read or a write elsewhere.
Standard library only, like `manifest`. docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path, PurePosixPath

NAME_MAX, PATH_MAX = 255, 4096  # bytes, as Linux counts them
RESERVED = ".fatpipe-"  # the manifest, the hash cache and partial copies: fatpipe's own names
REFUSED_CATEGORIES = {"Cc": "a control character", "Cf": "an invisible format character",
                      "Cs": "an undecodable byte", "Zl": "a line separator", "Zp": "a paragraph separator"}


class UnsafeName(ValueError):
    """A name or path that could leave the dataset folder; its text is the one-line report."""


def name_problem(name: object) -> str | None:
    """Why `name` is not a plain relative POSIX path inside a folder, else None."""
    if not isinstance(name, str) or not name:
        return "it is empty" if name == "" else "it is not a string"
    for c in name:
        category = unicodedata.category(c)
        if c == "\0" or category in REFUSED_CATEGORIES:
            return f"it holds {REFUSED_CATEGORIES.get(category, 'a NUL byte')} (U+{ord(c):04X})"
    if "\\" in name:
        return "it holds a backslash"
    if name.startswith("/"):
        return "it is absolute"
    segments = name.split("/")
    if "" in segments:
        return "it has an empty segment (//, or a trailing /)"
    if ".." in segments or "." in segments:
        return f"it has a {'..' if '..' in segments else '.'} segment"
    if any(RESERVED in s for s in segments):
        return f"it uses {RESERVED}, which fatpipe keeps for its own files"
    encoded = name.encode()
    if len(encoded) > PATH_MAX or any(len(s.encode()) > NAME_MAX for s in segments):
        return f"it is longer than a file name may be ({NAME_MAX} bytes a segment, {PATH_MAX} in all)"
    return None


def check_name(name: object, source: str) -> str:
    """`name` when it is safe, else UnsafeName naming it and `source`."""
    problem = name_problem(name)
    if problem:
        raise UnsafeName(f"unsafe file name {name!r} from {source}: {problem}; nothing was written")
    return name


def check_names(names: list, source: str) -> list[str]:
    """Every name safe, none twice, none both a file and a folder (`a` and `a/b`)."""
    seen: set[str] = set()
    for name in names:
        check_name(name, source)
        if name in seen:
            raise UnsafeName(f"file name {name!r} from {source} appears twice; nothing was written")
        seen.add(name)
    for name in seen:
        parent = name.rsplit("/", 1)[0] if "/" in name else None
        while parent:
            if parent in seen:
                raise UnsafeName(f"{parent!r} from {source} is both a file and the folder of {name!r}; "
                                 "nothing was written")
            parent = parent.rsplit("/", 1)[0] if "/" in parent else None
    return list(names)


def data_path(manifest: dict, root: Path, source: str = "the manifest") -> Path:
    """The manifest's `path` under `root`, when it is a plain relative path outside .fatpipe/ and .git/."""
    path = manifest.get("path") if isinstance(manifest, dict) else None
    if name_problem(path) or PurePosixPath(str(path)).parts[:1] in ((".fatpipe",), (".git",)):
        raise UnsafeName(f"unsafe data path {path!r} in {source}: not a plain path inside the project folder")
    return Path(root) / path


def check_manifest(manifest: dict, source: str) -> dict:
    """A manifest read from anywhere: its `path` and every file name safe, else UnsafeName."""
    data_path(manifest, Path("."), source)
    check_names([f.get("name") if isinstance(f, dict) else f for f in manifest.get("files", [])], source)
    return manifest


def dataset_base(manifest: dict, root: Path) -> Path:
    """The folder a manifest's files live in: its path, or a single file's folder."""
    base = data_path(manifest, root)
    return base if manifest["kind"] == "folder" else base.parent


def first_link(base: Path, target: Path) -> Path | None:
    """The first symbolic link from `base` down to `target` (inclusive), else None."""
    here = Path(base)
    for part in Path(target).relative_to(base).parts:
        here = here / part
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return here
        except FileNotFoundError:
            return None
    return None


def clear_links(base: Path, target: Path) -> list[Path]:
    """Remove every link between `base` and `target` (the link itself, never what it points to), so
    that writing `target` lands in the dataset folder: it is fatpipe's alone, and a link is no data."""
    removed = []
    while (link := first_link(base, target)) is not None:
        os.unlink(link)
        removed.append(link)
    return removed


def require_inside(base: Path, target: Path) -> Path:
    """`target` when, links resolved, it lies under `base` resolved; else UnsafeName."""
    real_base, real = Path(os.path.realpath(base)), Path(os.path.realpath(target))
    if real_base not in real.parents:  # not is_relative_to: nodes may run Python 3.8
        raise UnsafeName(f"{target} resolves to {real}, outside the dataset folder {real_base}; nothing was written")
    return target


def writable_target(base: Path, target: Path) -> Path:
    """Make `target`'s folders, links cleared, and check it stays inside `base` before and after."""
    clear_links(base, target)
    require_inside(base, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    clear_links(base, target)  # made while the folders were: none expected
    return require_inside(base, target)


def open_nofollow(path: Path, flags: int, mode: int = 0o644):
    """A binary file object for `path` that never follows a link at its last component."""
    fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    return os.fdopen(fd, "r+b" if flags & os.O_RDWR else ("wb" if flags & os.O_WRONLY else "rb"))
