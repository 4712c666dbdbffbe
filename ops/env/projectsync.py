"""The project's push to an ssh node: a push replaces or deletes only files that came from this
machine, never what a run wrote there (docs/ARCHITECTURE.md, "The project folder on a node").

A user's script runs with the project folder as its working directory and writes there (`ckpt/`,
an `out/` of `.safetensors`), beside the code. So the node keeps a record of what the last push
sent (`infra.node.PUSH_RECORD`: each path with the signature it had, size and time, or a link's
target), and each push, per path:

- sends a file the node lacks, or holds as a push left it (the user's edit goes over);
- leaves a file the node holds equal to this machine's but no push sent (a pull brought it
  here): the node's still, never deleted when the local copy goes;
- keeps the node's file when the node's differs and no push left it so: the run wrote or changed
  it (said in one line, never replaced);
- deletes a file an earlier push sent that is gone from this project, only while it is still what
  the push sent (a run that changed it keeps it); a file still here but now ignored or excluded
  is left, as rsync's `--delete` leaves excluded files.

What is sent is rsync's own listing with the push's filters (the excludes, the .gitignore files),
so the record and the copy agree on every rule. The record is written before the copy with both
the old and the new signature of each replaced file, so an interrupted copy leaves nothing that
the next push would take for the run's. A folder without a record (pushed by an earlier fatpipe)
is updated as before, deleting nothing, and recorded from then on. A node that already holds
exactly what the push would leave (`in_place`) gets neither the record nor the copy.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from fatpipe.infra.errors import FatpipeError
from fatpipe.node import source_file
from fatpipe.node.pushed import exact, signature

from ..reach.asknode import Step, recall
from ..reach.transport import GITIGNORE_FILTER, Result, Transport

NODE_PROGRAM = source_file("pushed")
SHOWN = 5  # file names a line names before "and N more"


@dataclass
class PushPlan:
    """What a push does on one node: `send` (paths, folders first), the `record` it leaves, the
    files to `delete` (with the signatures a push gave them) and those `kept` as the node's."""

    send: list[str] = field(default_factory=list)
    record: dict[str, list] = field(default_factory=dict)
    delete: dict[str, list] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)


@dataclass
class PushReport:
    """What a push did beyond copying: files deleted, files kept as the run's (two kinds)."""

    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # here and there, the node's differs: not sent
    kept_gone: list[str] = field(default_factory=list)  # gone from here, changed there: not deleted
    copied: bool = True  # False: the node held exactly what the push would send; nothing went

    def lines(self) -> list[str]:
        said = []
        if self.kept:
            said.append(f"kept {_names(self.kept)} as the node's: a run wrote or changed them there since the "
                        "last push, so this machine's copies were not sent (`fatpipe pull` brings them here)")
        if self.kept_gone:
            said.append(f"kept {_names(self.kept_gone)}: gone from this project, but a run changed them on the "
                        "node since they were pushed")
        if self.deleted:
            said.append(f"removed {_names(self.deleted)}: pushed before, gone from this project since")
        return said


def _names(paths: list[str]) -> str:
    shown = ", ".join(sorted(paths)[:SHOWN])
    more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
    return f"{len(paths)} file(s) ({shown}{more})"


def _unescape(name: bytes) -> str:
    """A name as rsync's --out-format prints it (control characters as \\#ooo), back as a path."""
    return os.fsdecode(re.sub(rb"\\#([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), name))


def local_listing(src: Path, excludes: tuple[str, ...]) -> list[str]:
    """What a push of `src` sends, as rsync lists it with the push's own filters (folders end in /)."""
    filters = [*(f"--exclude={pattern}" for pattern in excludes), GITIGNORE_FILTER]
    with tempfile.TemporaryDirectory(prefix="fatpipe-list-") as empty:
        done = subprocess.run(["rsync", "-a", "--dry-run", "--out-format=%n", *filters, "--", f"{src}/", f"{empty}/"],
                              capture_output=True, timeout=600)
    if done.returncode:
        raise FatpipeError(f"cannot list the project folder {src} for the push: "
                           f"{done.stderr.decode(errors='replace').strip()[-300:]}")
    return [_unescape(line) for line in done.stdout.split(b"\n") if line and line != b"./"]


def plan_push(local: dict[str, list], folders: list[str], record: dict | None, node: dict[str, list | None],
              still_here) -> PushPlan:
    """The push's decisions for one node (see the module's docstring); `still_here(path)`: the
    path exists in the local project (ignored or not)."""
    plan, ours = PushPlan(send=list(folders)), record or {}
    for path, sig in local.items():
        there = node.get(path)
        pushed = record is None or there in _as_list(ours.get(path))  # no record: as before, all ours
        if there is None or (there == sig and pushed):
            plan.record[path] = [sig]
        elif there == sig:
            continue  # equal, but the node's (pulled here, say): never ours to delete
        elif pushed:
            plan.record[path] = [there, sig]  # until the copy is done, either is what a push left
        else:
            plan.kept.append(path)
            continue
        plan.send.append(path)
    for path, pushed in ours.items():
        if path in local or not _as_list(pushed) or not _relative(path):
            continue
        if still_here(path):
            plan.record[path] = pushed  # ignored or excluded now: left on the node, still known as ours
        elif node.get(path) is not None:
            plan.delete[path] = pushed
    return plan


def _as_list(value) -> list:
    """A record's entry as the list of signatures it should be (the node's file: trust no shape)."""
    return value if isinstance(value, list) else []


def _relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and ".." not in parts and "\0" not in path


class ProjectPush:
    """One node's project push: look, decide, delete and record, copy."""

    def __init__(self, t: Transport, src: Path, dest: str, excludes: tuple[str, ...], made: bool = False):
        self.t, self.src, self.dest, self.excludes, self.made = t, Path(src), dest, excludes, made

    def node(self, action: str, given: dict) -> dict:
        command = f"python3 -c {shlex.quote(NODE_PROGRAM.read_text())} {action} {shlex.quote(self.dest)}"
        done = self.t.run(command, timeout=300, stdin_text=json.dumps(given))
        if done.ok:
            try:
                return json.loads(done.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                pass
        raise FatpipeError(f"{self.t.describe()}: reading what the last push sent failed: {done.reason()}")

    def look(self, paths: list[str]) -> dict:
        """What the node holds of `paths` and its push record: brought by the launch's first call, or asked."""
        brought = recall(self.t, look_step(self.dest, paths))
        return brought["ok"] if brought and "error" not in brought else self.node("look", {"paths": paths})

    def run(self) -> PushReport:
        if not self.made and not (made := self.t.make_dir(self.dest)).ok:
            raise FatpipeError(f"{self.t.describe()}: cannot make {self.dest}: {made.reason()}")
        listed = local_listing(self.src, self.excludes)
        folders = [p.rstrip("/") for p in listed if p.endswith("/")]
        local = {p: signature(str(self.src / p)) for p in listed if not p.endswith("/")}
        seen = self.look(look_paths(listed))
        plan = plan_push({p: s for p, s in local.items() if s}, folders, seen["record"], seen["node"],
                         lambda p: os.path.lexists(self.src / p))
        if in_place(plan, seen, local, self.src):
            return PushReport(kept=plan.kept, copied=False)
        done = self.node("commit", {"record": plan.record, "delete": plan.delete})
        copied = copy_listed(self.t, self.src, self.dest, plan.send)
        if not copied.ok:
            raise FatpipeError(f"{self.t.describe()}: copy the project folder failed: {copied.reason()}")
        return PushReport(done.get("deleted", []), plan.kept, done.get("kept", []))


def look_paths(listed: list[str]) -> list[str]:
    """What a push's look asks the node about: every path the push lists, folders without their `/`."""
    return [p.rstrip("/") for p in listed]


def pushed_paths(src: Path, excludes: tuple[str, ...]) -> list[str]:
    """The paths (folders too) a push of `src` with `excludes` asks the node about, in its order."""
    return look_paths(local_listing(Path(src), excludes))


def in_place(plan: PushPlan, seen: dict, local: dict[str, list | None], src: Path) -> bool:
    """Whether the node already holds exactly what this push would leave: every folder there,
    every file with this machine's signature (size and time, as rsync's own check compares them),
    the record as the push would write it and nothing to delete. Then neither the record nor the
    copy is sent: a warm launch with nothing changed makes no transfer for the project."""
    node, there = seen["node"], seen.get("exact") or {}
    if plan.delete or seen["record"] != plan.record:
        return False
    # A signature has whole seconds: a same-size edit within the second of the pushed copy is
    # caught by the time in ns (rsync -a carries it over), a chmod by the mode.
    return all(node.get(p) == local[p] and (local[p][0] != "f" or there.get(p) == exact(src / p))
               if p in local else node.get(p) == ["d"] for p in plan.send)


def look_step(dest: str, paths: list[str]) -> Step:
    """The node program's step that answers a push's look (pushed.look) in the project folder `dest`."""
    return Step("pushed.look", (tuple(paths),), dest, (("pushed", NODE_PROGRAM),))


def copy_listed(t: Transport, src: Path, dest: str, paths: list[str]) -> Result:
    """rsync exactly `paths` (a folder alone, not its content) from `src` to `dest` on the node,
    deleting nothing; the names travel in a file, NUL-separated, never as arguments."""
    with tempfile.NamedTemporaryFile(prefix="fatpipe-push-", suffix=".list") as listing:
        listing.write(b"".join(os.fsencode(path) + b"\0" for path in paths))
        listing.flush()
        return t.copy_to(f"{src}/", f"{dest}/", [f"--files-from={listing.name}", "--from0"], timeout=900)


def push_project(t: Transport, src: Path, dest: str, excludes: tuple[str, ...], made: bool = False) -> PushReport:
    """Push the project folder `src` to `dest` on the node (`made`: it exists); what it deleted and kept."""
    return ProjectPush(t, src, dest, excludes, made).run()
