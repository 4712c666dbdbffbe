"""The project push (`ops.env.projectsync`) replaces or deletes on a node only what came from this
machine: the real node program, rsync's real listing and a real `--files-from` copy, into a
folder of this machine that stands for the node's project folder. The multi-node proof over
SSH is tests/system/test_node_folder.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fatpipe.infra.node import PUSH_RECORD
from fatpipe.ops.env.projectsync import plan_push, push_project
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.reach.transport import LocalTransport, Result

from .test_runsync import write

pytestmark = pytest.mark.skipif(not shutil.which("rsync"), reason="needs rsync (make system-packages)")


class FolderTransport(LocalTransport):
    """A node whose home is a folder of this machine, reached as a remote node is: commands run
    there, `copy_to` is rsync into it (or fails once, as told)."""

    shares_fs = False

    def __init__(self, home: Path, fail_copy: bool = False):
        super().__init__("n0")
        self.home, self.fail_copy = home, fail_copy

    def argv(self, command: str) -> list[str]:
        return ["bash", "-c", f"cd {self.home} && {command}"]

    def copy_to(self, src, dest, extra=(), timeout=900) -> Result:
        if self.fail_copy:
            self.fail_copy = False
            return Result(12, "", "rsync: connection unexpectedly closed")
        done = subprocess.run(["rsync", "-a", *extra, "--", src, str(self.home / dest)], capture_output=True,
                              text=True, timeout=120)
        return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def sides(tmp_path):
    """(the local project, the node's project folder, a push of one into the other)."""
    here, home = tmp_path / "project", tmp_path / "home"
    home.mkdir()
    node = FolderTransport(home)

    def push(excludes=(".fatpipe",)):
        return push_project(node, here, "proj", excludes)
    write(here / "train.py", "v1", age_s=100)
    write(here / ".gitignore", "logs/\n")
    return here, home / "proj", push


def test_a_run_s_files_survive_every_push_and_code_that_left_is_removed(sides):
    here, there, push = sides
    write(here / "old.py", "leaves soon")
    write(here / "pkg" / "util.py", "u")
    assert push().lines() == []
    assert (there / "train.py").read_text() == "v1" and (there / "pkg" / "util.py").is_file()
    # The run writes beside the code, in folders that are not ignored.
    write(there / "ckpt" / "step-10.pt", "weights")
    write(there / "out" / "model.safetensors", "tensors")
    write(there / "logs" / "x.log", "ignored here, written there")
    write(here / "train.py", "v2")  # an edit
    (here / "old.py").unlink()  # a file that left the project; the run never touched it
    shutil.rmtree(here / "pkg")
    report = push()
    assert (there / "train.py").read_text() == "v2"
    assert not (there / "old.py").exists() and not (there / "pkg").exists()
    assert (there / "ckpt" / "step-10.pt").read_text() == "weights"
    assert (there / "out" / "model.safetensors").read_text() == "tensors"
    assert (there / "logs" / "x.log").is_file()
    assert report.deleted == ["old.py", "pkg/util.py"] and report.kept == []
    assert push().lines() == []  # again (a `--resume` launch): nothing changes, nothing said


def test_a_file_the_run_changed_is_never_replaced_nor_deleted(sides):
    here, there, push = sides
    write(here / "notes.md", "pushed")
    write(here / "out" / "log.txt", "")
    write(here / "gone.txt", "pushed")
    push()
    write(there / "out" / "log.txt", "step 1\nstep 2\n")  # a tracked file the run appends to
    write(there / "gone.txt", "the run rewrote it")
    write(there / "result.json", "the run's")  # the run's; a copy of it is also here now
    write(here / "result.json", "an older copy, brought here by hand")
    (here / "gone.txt").unlink()
    write(here / "notes.md", "edited here")
    report = push()
    assert (there / "out" / "log.txt").read_text() == "step 1\nstep 2\n"
    assert (there / "gone.txt").read_text() == "the run rewrote it"
    assert (there / "result.json").read_text() == "the run's"
    assert (there / "notes.md").read_text() == "edited here"  # unchanged there: the user's edit goes
    assert sorted(report.kept) == ["out/log.txt", "result.json"] and report.kept_gone == ["gone.txt"]
    lines = report.lines()
    assert len(lines) == 2 and "out/log.txt, result.json" in lines[0] and "gone.txt" in lines[1]
    # Neither is ours any more: once gone from here too, still never deleted.
    (here / "out" / "log.txt").unlink()
    assert push().deleted == [] and (there / "out" / "log.txt").is_file()


def test_a_run_s_file_pulled_here_is_still_the_node_s(sides):
    here, there, push = sides
    push()
    write(there / "out" / "model.safetensors", "the run's")
    subprocess.run(["rsync", "-a", f"{there}/out", f"{here}/"], check=True)  # as `fatpipe pull out` does
    assert push().lines() == []  # equal on both sides: nothing to send, nothing to say
    shutil.rmtree(here / "out")  # the local copy is not needed any more
    assert push().deleted == [] and (there / "out" / "model.safetensors").read_text() == "the run's"


def test_a_file_now_ignored_is_left_but_removed_once_gone(sides):
    here, there, push = sides
    write(here / "data.csv", "pushed")
    push()
    write(here / ".gitignore", "logs/\ndata.csv\n")
    assert push().deleted == [] and (there / "data.csv").is_file()  # excluded: as --delete leaves it
    (here / "data.csv").unlink()
    assert push().deleted == ["data.csv"] and not (there / "data.csv").exists()


def test_an_interrupted_copy_leaves_nothing_the_next_push_takes_for_the_run(sides, tmp_path):
    here, there, push = sides
    push()
    write(here / "train.py", "v2")
    node = FolderTransport(tmp_path / "home", fail_copy=True)
    with pytest.raises(Exception, match="copy the project folder failed"):
        push_project(node, here, "proj", (".fatpipe",))
    assert (there / "train.py").read_text() == "v1"  # the copy never happened
    report = push()
    assert (there / "train.py").read_text() == "v2" and report.kept == []


def test_a_folder_an_earlier_fatpipe_pushed_is_updated_and_nothing_deleted(sides):
    here, there, push = sides
    write(there / "train.py", "old code")
    write(there / "stale.py", "pushed by an earlier fatpipe, or the run's: unknown")
    report = push()
    assert (there / "train.py").read_text() == "v1" and (there / "stale.py").is_file()
    assert report.lines() == []
    assert set(json.loads((there / PUSH_RECORD).read_text())["files"]) == {"train.py", ".gitignore"}


def test_odd_names_travel_and_leave_like_any_other(sides):
    here, there, push = sides
    names = ["a b.py", "new\nline.txt", "star*.py", "[x].py", "-rf", "ü.txt"]
    for name in names:
        write(here / "odd" / name, name)
    push()
    assert sorted(p.name for p in (there / "odd").iterdir()) == sorted(names)
    shutil.rmtree(here / "odd")
    assert sorted(push().deleted) == sorted(f"odd/{n}" for n in names)
    assert not (there / "odd").exists()


def test_a_record_on_the_node_never_leads_a_delete_out_of_the_project_folder(sides, tmp_path):
    here, there, push = sides
    pushed = write(here / "lib" / "keep.txt", "pushed")
    push()
    # Outside the project folder, a file equal to the pushed one (size and time): only where it
    # lies can tell them apart.
    outside = write(tmp_path / "outside" / "keep.txt", "pushed")
    os.utime(outside, (pushed.stat().st_mtime, pushed.stat().st_mtime))
    record_path = there / PUSH_RECORD
    record = json.loads(record_path.read_text())
    sig = record["files"]["lib/keep.txt"]
    # The record (the node's to write) names paths outside; a link is put in place of a pushed folder.
    record["files"].update({str(outside): sig, "../outside/keep.txt": sig, "lib/../../outside/keep.txt": sig})
    record_path.write_text(json.dumps(record))
    shutil.rmtree(there / "lib")
    os.symlink(tmp_path / "outside", there / "lib")
    shutil.rmtree(here / "lib")
    report = push()
    assert outside.read_text() == "pushed" and report.deleted == [] and report.kept_gone == ["lib/keep.txt"]


@pytest.mark.parametrize("case,node,record,want", [
    ("absent there: sent", None, {}, "send"),
    ("equal there, ours: recorded", ["f", 1, 5], {"p": [["f", 1, 5]]}, "send"),
    ("equal there, the node's: left", ["f", 1, 5], {}, "left"),
    ("ours, unchanged: sent", ["f", 9, 1], {"p": [["f", 9, 1]]}, "send"),
    ("the run changed it: kept", ["f", 3, 7], {"p": [["f", 9, 1]]}, "kept"),
    ("the run wrote it: kept", ["f", 3, 7], {}, "kept"),
    ("no record at all: sent, as before", ["f", 3, 7], None, "send"),
    ("a record entry of no shape: the run's", ["f", 3, 7], {"p": "f"}, "kept"),
])
def test_each_path_is_decided_by_whose_it_is(case, node, record, want):
    plan = plan_push({"p": ["f", 1, 5]}, [], record, {"p": node}, lambda p: True)
    assert ("p" in plan.send, "p" in plan.kept, "p" in plan.record) == (want == "send", want == "kept",
                                                                        want == "send"), case


def test_the_project_push_through_prepare_keeps_runs_pulled_paths_and_data(tmp_path, monkeypatch):
    """prepare_node's push: a run folder inside the project, what `[run] pull` brings back and
    the staged data are the node's, neither sent nor deleted."""
    from fatpipe.ops.run.prepare import prepare_node

    project, home, run_rel = tmp_path / "project", tmp_path / "home", "myruns/r2"
    there = home / "proj"
    write(project / "train.py", "new code")
    write(project / run_rel / "rendezvous.json", "{}")
    write(project / "out" / "ckpt.pt", "the local copy [run] pull brought back")
    write(there / run_rel / "checkpoints" / "step-00000005.pt", "the node's checkpoint")
    write(there / "out" / "ckpt.pt", "the node's newer checkpoint")
    write(there / "out" / "only-there.pt", "the node's")
    write(there / "data" / "shard-0.bin", "staged")
    monkeypatch.setattr("fatpipe.ops.run.prepare.claim_project_dir", lambda *args: None)  # tests/system/test_node_folder.py
    monkeypatch.setattr("fatpipe.ops.run.prepare.data_excludes", lambda *args: ("/data",))
    monkeypatch.setattr("fatpipe.ops.run.prepare.push_run", lambda *args: Result(0, "", ""))
    node = FolderTransport(home)
    node.push = lambda *args, **kwargs: Result(0, "", "")  # the trainer package: not this test's
    node_run = SimpleNamespace(name="n0", transport=node, plan=SimpleNamespace(workdir="proj"),
                               rdzv=SimpleNamespace(run_rel=run_rel, cluster="c"))
    declared = SimpleNamespace(root=project, project_id="0a1b2c3d",
                               spec=SimpleNamespace(run=SimpleNamespace(pull=["out"]), clusters={}))
    said = []
    prepare_node(Cluster(declared, SimpleNamespace(name="c"), log=said.append), node_run, project / run_rel, 0)
    assert (there / "train.py").read_text() == "new code"
    assert not (there / run_rel / "rendezvous.json").exists()  # the run folder travels by push_run
    assert (there / run_rel / "checkpoints" / "step-00000005.pt").read_text() == "the node's checkpoint"
    assert (there / "out" / "ckpt.pt").read_text() == "the node's newer checkpoint"
    assert (there / "out" / "only-there.pt").read_text() == "the node's"
    assert (there / "data" / "shard-0.bin").read_text() == "staged"
    assert any("copy the project folder" in line for line in said)


def test_the_node_program_deletes_nothing_outside_its_folder_whatever_it_is_told(tmp_path, monkeypatch):
    from fatpipe.node import pushed

    assert pushed.RECORD == PUSH_RECORD
    folder, outside = tmp_path / "proj", write(tmp_path / "x.txt", "outside")
    folder.mkdir()
    monkeypatch.chdir(folder)
    sig = pushed.signature(str(outside))
    done = pushed.commit({}, {"../x.txt": [sig], str(outside): [sig]})
    assert done == {"deleted": [], "kept": ["../x.txt", str(outside)]} and outside.read_text() == "outside"
    assert json.loads((folder / PUSH_RECORD).read_text()) == {"version": 1, "files": {}}


class CountingFolder(FolderTransport):
    """A FolderTransport that counts its copies and the node program's record writes."""

    def __init__(self, home: Path):
        super().__init__(home)
        self.copies = self.commits = 0

    def copy_to(self, src, dest, extra=(), timeout=900) -> Result:
        self.copies += 1
        return super().copy_to(src, dest, extra, timeout)

    def run(self, command, timeout=60, stdin_text=None) -> Result:
        self.commits += " commit " in command
        return super().run(command, timeout, stdin_text)


@pytest.fixture
def counted_sides(tmp_path):
    """(the local project, the node's project folder, the counting node, a push)."""
    here, home = tmp_path / "project", tmp_path / "home"
    home.mkdir()
    node = CountingFolder(home)
    write(here / "train.py", "v1", age_s=100)
    write(here / "pkg" / "util.py", "u", age_s=100)
    (here / "empty").mkdir()
    write(here / ".gitignore", "logs/\n")
    return here, home / "proj", node, lambda: push_project(node, here, "proj", (".fatpipe",))


def test_a_push_with_nothing_changed_copies_nothing_and_writes_no_record(counted_sides):
    here, there, node, push = counted_sides
    assert push().copied and (node.copies, node.commits) == (1, 1)
    write(there / "ckpt" / "step-1.pt", "the run's")  # what a run writes changes nothing of ours
    again = push()
    assert not again.copied and again.lines() == [] and (node.copies, node.commits) == (1, 1)
    assert (there / "train.py").read_text() == "v1" and (there / "ckpt" / "step-1.pt").is_file()


@pytest.mark.parametrize("change", ["edit", "same size, same second", "chmod", "new file", "removed",
                                    "folder gone there", "file gone there", "new empty folder"])
def test_any_change_a_push_would_carry_is_still_sent(counted_sides, change):
    here, there, node, push = counted_sides
    push()
    if change == "edit":
        write(here / "train.py", "v2 longer")
    elif change == "same size, same second":  # a signature has whole seconds; the copy's time has ns
        then = (here / "train.py").stat().st_mtime_ns
        (here / "train.py").write_text("v2")
        os.utime(here / "train.py", ns=(then + 1000, then + 1000))
    elif change == "chmod":
        (here / "train.py").chmod(0o755)
    elif change == "new file":
        write(here / "eval.py", "e")
    elif change == "removed":
        (here / "pkg" / "util.py").unlink()
    elif change == "folder gone there":
        (there / "empty").rmdir()
    elif change == "file gone there":
        (there / "pkg" / "util.py").unlink()
    else:
        (here / "more").mkdir()
    report = push()
    assert report.copied or change == "removed", change
    assert node.copies == 2 or change == "removed", change
    assert node.commits == 2, change  # the record (and a delete) is written
    if change == "edit":  # (the same size in the same second: rsync's own check decides, as before)
        assert (there / "train.py").read_text() == (here / "train.py").read_text()
    if change == "chmod":
        assert os.access(there / "train.py", os.X_OK)
    if change == "removed":
        assert not (there / "pkg" / "util.py").exists()
    if change == "folder gone there":
        assert (there / "empty").is_dir()
    if change == "file gone there":
        assert (there / "pkg" / "util.py").read_text() == "u"
