"""The node side of a project push (`ops.env.projectsync`): what the node holds, and what an earlier
push sent there. Standard library only: it travels as `python3 -c` text with the action and the
project folder as arguments, its input as JSON on stdin, its answer as JSON on stdout.

`look`: the push record (None: no push recorded it yet), each asked path's signature and, for a
file, its time to the nanosecond and its mode (whether a push would change anything at all).
`commit`: delete the files that left the project, each only while it is still what a push sent
(a run that changed it keeps it) and only inside the project folder (links followed); then
write the new record, atomically.
"""

from __future__ import annotations

import json
import os
import stat
import sys

RECORD = ".fatpipe/pushed.json"  # infra.node.PUSH_RECORD, inside the project folder on the node


def signature(path: str) -> list | None:
    """["f", size, mtime in s] for a file, ["l", target] for a link, ["d"] or ["o"]; None: absent."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return ["l", os.readlink(path)]
    if stat.S_ISREG(info.st_mode):
        return ["f", info.st_size, int(info.st_mtime)]
    return ["d"] if stat.S_ISDIR(info.st_mode) else ["o"]


def read_record() -> dict | None:
    try:
        with open(RECORD) as f:
            files = json.load(f).get("files")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return {}  # unreadable: trust nothing in it (nothing is deleted), but a push did happen
    return files if isinstance(files, dict) else {}


def exact(path: str) -> list | None:
    """[mtime in ns, mode] of a regular file (what rsync -a would also carry over); None otherwise."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return [info.st_mtime_ns, info.st_mode] if stat.S_ISREG(info.st_mode) else None


def look(paths: list[str]) -> dict:
    record = read_record()
    asked = set(paths) | set(record or {})
    return {"record": record, "node": {p: signature(p) for p in asked}, "exact": {p: exact(p) for p in paths}}


def inside(root: str, path: str) -> bool:
    """Whether `path`'s folder, links followed, lies in the project folder `root`."""
    parent = os.path.realpath(os.path.dirname(path) or ".")
    return parent == root or parent.startswith(root + os.sep)


def prune(root: str, folder: str) -> None:
    """Remove `folder` and its parents while they are empty, up to the project folder."""
    while folder and os.path.realpath(folder) != root:
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = os.path.dirname(folder)


def commit(record: dict, delete: dict) -> dict:
    root = os.path.realpath(".")
    deleted, kept = [], []
    for path, pushed in sorted(delete.items()):
        now = signature(path)
        if now is None:
            continue
        if now in pushed and now[0] in ("f", "l") and inside(root, path):
            os.unlink(path)
            deleted.append(path)
            prune(root, os.path.dirname(path))
        else:
            kept.append(path)
    os.makedirs(os.path.dirname(RECORD), exist_ok=True)
    tmp = f"{RECORD}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"version": 1, "files": record}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, RECORD)
    return {"deleted": deleted, "kept": kept}


def main() -> None:
    action, folder = sys.argv[1], sys.argv[2]
    os.chdir(folder)
    given = json.load(sys.stdin)
    answer = look(given["paths"]) if action == "look" else commit(given["record"], given["delete"])
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
