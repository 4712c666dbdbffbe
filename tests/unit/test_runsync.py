"""A run folder between this machine and its nodes: a push sends only the inputs and deletes
nothing; a pull goes through a partial folder, is checked, and never lets one node's files
replace another's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fatpipe.ops.reach.transport import LocalTransport, Result, SshTransport, only_filters
from fatpipe.ops.run import sync

RUN_REL = ".fatpipe/c/runs/r1"


class FolderTransport(LocalTransport):
    """A node whose files live in a folder of this machine, reached as a remote node is (copies):
    `pull` copies as `rsync -a` does (modification times kept), or fails as told."""

    shares_fs = False

    def __init__(self, name: str, home: Path, fail: str | None = None, code: int = 23):
        super().__init__(name)
        self.home, self.fail, self.code = home, fail, code
        self.pulls: list[tuple[str, tuple]] = []

    def argv(self, command: str) -> list[str]:
        return ["bash", "-c", f"cd {self.home} && {command}"]

    def pull(self, src, dest, excludes=(), timeout=900, link_dest=None) -> Result:
        self.pulls.append((src, tuple(excludes)))
        ignore = shutil.ignore_patterns("checkpoints") if "/checkpoints/" in excludes else None
        shutil.copytree(self.home / src, dest, dirs_exist_ok=True, ignore=ignore)
        if self.fail:
            return Result(self.code, "", self.fail)
        return Result(0, "", "")


def node(name: str, rank: int, home: Path, fail: str | None = None, live: bool = False, code: int = 23):
    return SimpleNamespace(name=name, transport=FolderTransport(name, home, fail, code),
                           plan=SimpleNamespace(rank=rank, workdir="proj"),
                           rdzv=SimpleNamespace(run_rel=RUN_REL, run_id="r1", live=live))


def write(path: Path, text: str, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:
        then = path.stat().st_mtime - age_s
        os.utime(path, (then, then))
    return path


@pytest.fixture
def cluster(tmp_path):
    """Two nodes' run folders as training left them, and this machine's run folder."""
    homes = [tmp_path / "n0", tmp_path / "n1"]
    runs = [home / "proj" / RUN_REL for home in homes]
    write(runs[0] / "rendezvous.json", "node copy")
    write(runs[0] / "node-0.log", "log of node 0")
    write(runs[0] / "node-0.exit", "143\n")
    write(runs[0] / "node-1.log", "a stale copy of node 1's log", age_s=3600)
    write(runs[0] / "metrics.jsonl", '{"step": 30}\n')
    write(runs[0] / "summary.json", "{}")
    write(runs[0] / "checkpoints" / "step-00000030.pt", "shared part")
    write(runs[0] / "checkpoints" / "rank-0" / "step-00000030.pt", "rank 0 part")
    write(runs[1] / "node-1.log", "log of node 1")
    write(runs[1] / "node-1.exit", "143\n")
    write(runs[1] / "metrics.jsonl", '{"step": 10}\n', age_s=3600)  # stale: older than node 0's
    write(runs[1] / "checkpoints" / "rank-1" / "step-00000030.pt", "rank 1 part")
    local = tmp_path / "local" / RUN_REL
    write(local / "rendezvous.json", "this machine's copy")
    return SimpleNamespace(homes=homes, local=local)


def test_a_pull_places_each_nodes_own_files_and_leaves_checkpoints_on_the_nodes(cluster):
    nodes = [node("c-0", 0, cluster.homes[0]), node("c-1", 1, cluster.homes[1])]
    pulled = sync.pull_runs(nodes, cluster.local)
    assert pulled.ok and set(pulled.placed) == {"c-0", "c-1"}
    local = cluster.local
    assert (local / "node-0.log").read_text() == "log of node 0"
    assert (local / "node-1.log").read_text() == "log of node 1"  # not node 0's stale copy
    assert (local / "metrics.jsonl").read_text() == '{"step": 30}\n'  # the newer copy wins
    assert (local / "rendezvous.json").read_text() == "this machine's copy"  # inputs stay ours
    assert not (local / "checkpoints").exists()
    assert all(excludes == ("/checkpoints/",) for n in nodes for _, excludes in n.transport.pulls)
    assert not list(local.glob(".pull-*"))


def test_a_pull_with_checkpoints_brings_every_ranks_part(cluster):
    nodes = [node("c-0", 0, cluster.homes[0]), node("c-1", 1, cluster.homes[1])]
    assert sync.pull_runs(nodes, cluster.local, checkpoints=True).ok
    ckpt = cluster.local / "checkpoints"
    assert (ckpt / "step-00000030.pt").read_text() == "shared part"
    assert (ckpt / "rank-0" / "step-00000030.pt").read_text() == "rank 0 part"
    assert (ckpt / "rank-1" / "step-00000030.pt").read_text() == "rank 1 part"


def test_a_failed_pull_is_named_and_changes_nothing_here(cluster):
    write(cluster.local / "node-1.log", "the log pulled last time")
    nodes = [node("c-0", 0, cluster.homes[0]),
             node("c-1", 1, cluster.homes[1], fail="rsync error: some files could not be transferred")]
    pulled = sync.pull_runs(nodes, cluster.local)
    [line] = pulled.failed
    assert line.startswith("c-1 (local): could not pull run r1 (rsync error") and "\n" not in line
    assert (cluster.local / "node-1.log").read_text() == "the log pulled last time"
    assert (cluster.local / "node-0.log").read_text() == "log of node 0"  # the other node's came
    assert not list(cluster.local.glob(".pull-*"))


def test_a_pull_from_a_running_node_whose_files_vanished_mid_copy_is_placed(cluster):
    """rsync's 24: a running run renamed files between rsync's listing and their copy."""
    vanished = "rsync warning: some files vanished before they could be transferred (code 24)"
    pulled = sync.pull_runs([node("c-0", 0, cluster.homes[0], fail=vanished, code=24)], cluster.local)
    assert pulled.ok and "metrics.jsonl" in pulled.placed["c-0"]
    assert (cluster.local / "metrics.jsonl").read_text() == '{"step": 30}\n'


def test_a_pull_without_the_nodes_log_is_a_failure(cluster):
    (cluster.homes[1] / "proj" / RUN_REL / "node-1.log").unlink()
    pulled = sync.pull_runs([node("c-1", 1, cluster.homes[1])], cluster.local)
    assert pulled.failed == ["c-1 (local): could not pull run r1 (node-1.log is missing there); "
                             "its files stay on the node"]
    assert not (cluster.local / "node-1.exit").exists()


@pytest.mark.parametrize(("rel", "rank", "elsewhere"), [
    ("rendezvous.json", 0, True), ("node-1.env", 1, True), ("node-1.sh", 1, True),
    ("netcheck.json", 0, True), ("node-1.log", 0, True), ("node-12.exit", 1, True),
    ("netcheck/node-1.log", 0, True), ("node-0.log", 0, False), ("node-1.earlier.log", 1, False),
    ("metrics.jsonl", 1, False), ("checkpoints/rank-1/step-00000010.pt", 0, False),
    ("tb/events.out.tfevents.1.host.1.0", 0, False), ("summary.json", 0, False),
])
def test_what_a_node_brings(rel, rank, elsewhere):
    assert sync.belongs_elsewhere(Path(rel), rank) is elsewhere


def test_checkpoint_sizes_are_measured_on_the_node(cluster):
    nodes = [node("c-0", 0, cluster.homes[0]), node("c-1", 1, cluster.homes[1])]
    shutil.rmtree(cluster.homes[1] / "proj" / RUN_REL / "checkpoints")
    sizes = sync.checkpoint_sizes(nodes)
    assert sizes["c-0"] >= len("shared part") + len("rank 0 part") and sizes["c-1"] == 0


# ---- pushes -------------------------------------------------------------------------------


def test_the_push_filters_send_inputs_only_and_delete_nothing(tmp_path):
    """The filters a run push uses, applied by real rsync between two folders."""
    if not shutil.which("rsync"):
        pytest.skip("needs rsync (make system-packages)")
    here, there = tmp_path / "here", tmp_path / "there"
    for name in ("rendezvous.json", "node-0.env", "node-0.sh", "node-1.sh", "netcheck.json"):
        write(here / name, f"new {name}")
    write(here / "metrics.jsonl", "this machine's stale copy")
    write(here / "node-0.log", "this machine's copy")
    write(here / "checkpoints" / "step-00000005.pt", "old local checkpoint")
    write(there / "rendezvous.json", "old")
    write(there / "metrics.jsonl", "the node's metrics")
    write(there / "node-0.log", "the node's log")
    write(there / "checkpoints" / "step-00000050.pt", "the node's checkpoint")
    subprocess.run(["rsync", "-a", *only_filters(sync.RUN_INPUTS), f"{here}/", f"{there}/"], check=True)
    assert (there / "rendezvous.json").read_text() == "new rendezvous.json"
    assert (there / "node-1.sh").read_text() == "new node-1.sh"
    assert (there / "netcheck.json").read_text() == "new netcheck.json"
    assert (there / "metrics.jsonl").read_text() == "the node's metrics"
    assert (there / "node-0.log").read_text() == "the node's log"
    assert sorted(p.name for p in (there / "checkpoints").iterdir()) == ["step-00000050.pt"]


def test_a_run_push_over_ssh_never_deletes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("fatpipe.ops.reach.transport._run", lambda argv, timeout, stdin_text=None: calls.append(argv) or Result(0, "", ""))
    t = SshTransport("n0", "10.0.0.5", tmp_path / "known_hosts", config="/dev/null")
    assert t.push_files(tmp_path, "proj/run", sync.RUN_INPUTS).ok
    rsync = calls[-1]
    assert rsync[0] == "rsync" and "--delete" not in rsync
    assert "--exclude=*" in rsync and rsync[-2:] == [f"{tmp_path}/", "10.0.0.5:proj/run/"]
    assert "--include=/rendezvous.json" in rsync and "--include=/node-*.sh" in rsync


def step(s: int, groups: int) -> str:
    return json.dumps({"step": s, "participants": groups, "time": 100.0 + s}) + "\n"


def test_a_live_runs_pull_makes_its_record_from_every_nodes_whole(tmp_path):
    """Node 0 was away for steps 4-6: the pulled run folder has every step, from node 1 there."""
    homes = [tmp_path / "n0", tmp_path / "n1"]
    runs = [home / "proj" / RUN_REL for home in homes]
    away = "".join(step(s, 2) for s in (1, 2, 3, 7, 8))
    for name, text in (("metrics.jsonl", away), ("live-node-0/metrics.jsonl", away),
                       ("node-0.log", "log of node 0")):
        write(runs[0] / name, text)
    write(runs[1] / "live-node-1" / "metrics.jsonl", "".join(step(s, 1 if 4 <= s <= 6 else 2)
                                                              for s in range(1, 9)))
    write(runs[1] / "node-1.log", "log of node 1")
    local = tmp_path / "local" / RUN_REL
    nodes = [node("c-0", 0, homes[0], live=True), node("c-1", 1, homes[1], live=True)]
    assert sync.pull_runs(nodes, local).ok
    steps = [json.loads(line) for line in (local / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["recorded_by"]) for r in steps] == [
        (1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1), (7, 0), (8, 0)]
    assert (local / "live-node-0" / "metrics.jsonl").read_text() == away  # node 0's own, as it was
