"""What fatpipe staged in a dataset folder: the record beside the data that a push deletes by.

A dataset folder may be the user's own: on nodes that share this machine's files it lies in the
project folder itself, and elsewhere its `path` may have held files before the first push. So a
push removes only the files `.fatpipe-staged.json` beside the data says fatpipe wrote there, and
nothing when that record is missing; and it writes over no file fatpipe did not stage
(`InTheWay`: one line, nothing written). A folder is *claimed*, fatpipe's alone and kept exactly
the manifest (`tidy`), only when its record says so: begun in a node's project folder fatpipe
claimed (`own`) while the dataset's place held no data. A push records each name before it
writes it, so an interrupted push still owns what it left. Standard library only, Python 3.8:
it runs on the nodes. docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .manifest import PARTIAL_SUFFIX, RECORD_NAME, hash_file
from .names import RESERVED, data_path, dataset_base, name_problem, open_nofollow, writable_target
from .tidy import name_list, prune

VERSION = 1
OWN_SUFFIXES = (PARTIAL_SUFFIX + ".etag", PARTIAL_SUFFIX)  # a staged file's partial copy and its tag


class InTheWay(ValueError):
    """Something fatpipe did not stage lies where the data goes; its text is the one-line refusal."""


def record_target(manifest: dict, root: Path) -> Path:
    """Where the record lives: inside a staged folder, beside a single staged file."""
    base = data_path(manifest, root)
    return base / RECORD_NAME if manifest["kind"] == "folder" else base.with_name(base.name + RECORD_NAME)


def landing_name(manifest: dict, root: Path, name: str) -> str:
    """A listed file's name in its dataset folder (a single file lands under the path's own name)."""
    return name if manifest["kind"] == "folder" else data_path(manifest, root).name


def _kind(path: Path) -> str | None:
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def holds_data(manifest: dict, root: Path) -> bool:
    """Whether the dataset's place holds a file that is not fatpipe's own (a link, an empty
    folder, a manifest or a partial copy hold no data; a link in the folder's place is someone's)."""
    base = data_path(manifest, root)
    if manifest["kind"] == "file" or _kind(base) != "dir":
        return _kind(base) == "file" or (manifest["kind"] == "folder" and os.path.islink(base))
    for folder, _, files in os.walk(base):  # links to folders are not entered
        if any(RESERVED not in n and _kind(Path(folder) / n) == "file" for n in files):
            return True
    return False


class Staged:
    """One dataset folder's record: whether fatpipe claimed it, the files and folders it wrote there."""

    def __init__(self, path: Path, claimed: bool, files: set, folders: set):
        self.path, self.claimed, self.files, self.folders = path, claimed, files, folders

    @classmethod
    def read(cls, manifest: dict, root: Path) -> Staged | None:
        """The folder's record; None when there is none (or it is a link, or unreadable)."""
        path = record_target(manifest, root)
        try:
            doc = None if path.is_symlink() else json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            return None
        names = [doc.get(key) if isinstance(doc.get(key), list) else [] for key in ("files", "folders")]
        files, folders = ({n for n in got if isinstance(n, str) and name_problem(n) is None} for got in names)
        return cls(path, doc.get("claimed") is True, files, folders)

    @classmethod
    def begin(cls, manifest: dict, root: Path, own: bool) -> Staged:
        """The folder's record, else a new one: claimed when `own` (the project folder is
        fatpipe's: an ssh node's) and the dataset's place holds no data yet."""
        found = cls.read(manifest, root)
        if found is not None:
            return found
        return cls(record_target(manifest, root), own and not holds_data(manifest, root), set(), set())

    def owns(self, name: str) -> bool:
        """Whether fatpipe staged `name` there (or it is the partial copy of a file it staged)."""
        for suffix in OWN_SUFFIXES:
            if name.endswith(suffix):
                name = name[:-len(suffix)]
                break
        return self.claimed or name in self.files

    def owns_folder(self, folder: str) -> bool:
        return self.claimed or folder in self.folders

    def forget(self, names: list[str], folders: list[str]) -> None:
        self.files -= set(names)
        self.folders -= set(folders)

    def write_ahead(self, manifest: dict, root: Path, names: list[str]) -> None:
        """Record `names` and the folders they need that are not there yet, before any is written;
        names no longer there nor listed are forgotten (a file of that name later is not ours)."""
        base, listed = dataset_base(manifest, root), set(names)
        for name in names:
            parts = name.split("/")
            self.folders |= {"/".join(parts[:i]) for i in range(1, len(parts))
                             if not os.path.lexists(base / "/".join(parts[:i]))}
        needed = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
        self.files = {n for n in self.files | listed if n in listed or os.path.lexists(base / n)}
        self.folders = {f for f in self.folders if f in needed or os.path.lexists(base / f)}
        self.save(manifest, root)

    def save(self, manifest: dict, root: Path) -> None:
        """Written aside, then renamed; a link planted at its name is removed, never followed."""
        target = writable_target(dataset_base(manifest, root), self.path)
        tmp = target.with_name(target.name + ".tmp")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        doc = {"version": VERSION, "claimed": self.claimed, "files": sorted(self.files),
               "folders": sorted(self.folders)}
        with open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL) as f:
            f.write((json.dumps(doc, indent=1) + "\n").encode())
        os.replace(tmp, target)


def in_the_way(manifest: dict, root: Path, staged: Staged, same=None) -> tuple[list[str], list[str]]:
    """(names where something fatpipe did not stage lies on the data's way, names already holding
    the listed bytes that fatpipe did not stage: kept, never written, never recorded). `same(entry,
    path)` says whether a file holds an entry's bytes (a local source's hashes); without it every
    file fatpipe did not stage is in the way (a remote source's bytes are known only once fetched)."""
    if staged.claimed:
        return [], []
    base, blocked, theirs = dataset_base(manifest, root), set(), []
    for entry in manifest["files"]:
        name = landing_name(manifest, root, entry["name"])
        parts = name.split("/")
        for rel in ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]:
            kind = _kind(base / rel)
            if kind is None or staged.owns(rel):
                break
            if rel != name and kind != "dir":  # a file or a link where a folder must be
                blocked.add(rel)
                break
            if rel == name:
                if kind == "file" and same is not None and same(entry, base / rel):
                    theirs.append(name)
                else:
                    blocked.add(name)
    return sorted(blocked), theirs


def describe_in_the_way(manifest: dict, names: list[str]) -> str:
    """`data holds 2 file(s) fatpipe did not stage where the data goes: a.bin, sub; ...`."""
    what = (f"{manifest['path']} holds {len(names)} file(s) fatpipe did not stage where the data goes: "
            f"{name_list(names)}" if manifest["kind"] == "folder"
            else f"{manifest['path']} is a file fatpipe did not stage")
    return f"{what}; nothing was written: move it away, or choose another [data] path"


def same_bytes(cache, chunk_size: int):
    """`in_the_way`'s comparison for a local source: the size, then the sha256 (the hash cache's when unchanged)."""
    def same(entry: dict, path: Path) -> bool:
        return os.stat(path).st_size == entry["size"] and \
            cache.hashes(path, lambda p: hash_file(p, chunk_size))[0] == entry["sha256"]
    return same


def make_room(manifest: dict, root: Path, staged: Staged, same=None) -> list[str]:
    """A push's first step in a dataset folder: refuse what fatpipe did not stage on the data's
    way (InTheWay), remove the extras it staged (every extra in a claimed folder), record what it
    will write. The names it removed."""
    blocked, theirs = in_the_way(manifest, root, staged, same)
    if blocked:
        raise InTheWay(describe_in_the_way(manifest, blocked))
    removed, emptied = prune(manifest, root, staged)
    staged.forget(removed, emptied)
    names = [landing_name(manifest, root, e["name"]) for e in manifest["files"]]
    staged.write_ahead(manifest, root, [n for n in names if n not in theirs])
    return removed
