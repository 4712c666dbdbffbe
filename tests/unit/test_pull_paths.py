"""`fatpipe pull` and `[run] pull`: which paths a pull takes, and that a pull lands whole or not at
all (a partial folder renamed into place), never replaces a local copy unless asked, and refuses a
path that is missing or leads out of the node's project folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.project import parse_project
from fatpipe.infra.runspec import pull_path
from fatpipe.ops.reach.transport import LocalTransport
from fatpipe.ops.run.pullpaths import NodeSource
from fatpipe.ops.run.pullpaths import copy_from_node as fetch

SIM = "[clusters.demo]\nprovider = \"sim\"\nisolation = \"loopback\"\n"
BAD = ["/etc/passwd", "../secrets", "out/../../x", ".", "./", "", ".fatpipe/demo/outputs.json", ".git/config",
       "out/*.pt", "out/ckpt[1].pt", "out\\x", "out/\nckpt"]


@pytest.mark.parametrize("value", BAD)
def test_a_path_outside_the_project_folder_is_refused_in_one_line_naming_it(value):
    with pytest.raises(ConfigError) as e:
        pull_path(value)
    assert repr(value) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("value", "normal"), [("out", "out"), ("./out/", "out"), ("out//ckpt.pt", "out/ckpt.pt"),
                                               ("-weird/x", "-weird/x")])
def test_a_path_inside_it_is_normalised(value, normal):
    assert pull_path(value) == normal


def test_run_pull_in_the_cluster_file_is_checked_like_the_command_line():
    assert parse_project(SIM + "[run]\npull = [\"./out/\", \"logs/x.txt\", \"out\"]\n", "f").run.pull == [
        "out", "logs/x.txt"]
    assert parse_project(SIM, "f").run.pull == []
    with pytest.raises(ConfigError, match=r"run\.pull: path '\.\./up' leaves the project folder"):
        parse_project(SIM + "[run]\npull = [\"../up\"]\n", "f")
    with pytest.raises(ConfigError, match="run.outputs: unknown key.*allowed: pull"):
        parse_project(SIM + "[run]\noutputs = [\"out\"]\n", "f")


class FolderNode(LocalTransport):
    """A node whose home is a folder of this machine, reached as a remote node is: its commands
    run there, and rsync copies from `host:path` as from `home/path`."""

    shares_fs = False

    def __init__(self, name: str, home: Path, broken_copy: bool = False):
        super().__init__(name)
        self.home, self.broken_copy, self.copies = home, broken_copy, []

    def argv(self, command: str) -> list[str]:
        return ["bash", "-c", f"cd {self.home} && {command}"]

    def remote_host(self) -> str:
        return "node"

    def rsync_argv(self, src: str, dest: str, extra=()) -> list[str]:
        self.copies.append(src)
        path = self.home / src.removeprefix("node:")
        if self.broken_copy:  # the connection drops half way: part of the copy is there, rsync fails
            return ["bash", "-c", f"mkdir -p {dest}/{path.name} && touch {dest}/{path.name}/half && exit 12"]
        return ["rsync", "-a", *extra, "--", str(path), dest]


@pytest.fixture
def node(tmp_path):
    home = tmp_path / "home"
    out = home / "proj" / "out"
    out.mkdir(parents=True)
    (out / "ckpt.pt").write_bytes(os.urandom(300_000))
    (out / "nested").mkdir()
    (out / "nested" / "log.txt").write_text("step 10\n")
    local = tmp_path / "local"
    local.mkdir()
    return NodeSource("n-0", FolderNode("n-0", home), "proj"), local


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_and_a_file_land_byte_identical_and_nothing_partial_is_left(node):
    source, local = node
    lines = []
    got = fetch(source, "out", local / "out", progress=lines.append)
    assert tree(local / "out") == tree(source.transport.home / "proj" / "out")
    assert any("100%" in line for line in lines), lines  # rsync's --info=progress2, line by line
    assert got.size >= 300_000 and not got.replaced and "pulled out (" in got.line(local)
    fetch(source, "out/ckpt.pt", local / "copy" / "ckpt.pt")
    assert (local / "copy" / "ckpt.pt").read_bytes() == (source.transport.home / "proj/out/ckpt.pt").read_bytes()
    assert not [p for p in local.rglob(".pull-*")]
    assert source.transport.copies == ["node:proj/out", "node:proj/out/ckpt.pt"]


def test_an_existing_copy_is_replaced_only_when_asked(node):
    source, local = node
    (local / "out").mkdir()
    (local / "out" / "mine.txt").write_text("keep me")
    with pytest.raises(FatpipeError, match=r"out exists; --force replaces it with out from n-0"):
        fetch(source, "out", local / "out")
    assert tree(local / "out") == {"mine.txt": b"keep me"} and source.transport.copies == []
    got = fetch(source, "out", local / "out", replace=True)
    assert got.replaced and tree(local / "out") == tree(source.transport.home / "proj" / "out")
    assert not [p for p in local.rglob(".pull-*")]


def test_a_failed_copy_leaves_the_local_side_as_it_was(node):
    source, local = node
    broken = NodeSource("n-0", FolderNode("n-0", source.transport.home, broken_copy=True), "proj")
    (local / "out").mkdir()
    (local / "out" / "mine.txt").write_text("keep me")
    with pytest.raises(FatpipeError) as e:
        fetch(broken, "out", local / "out", replace=True)
    assert "could not pull out" in str(e.value) and "is as it was" in str(e.value) and "\n" not in str(e.value)
    assert tree(local / "out") == {"mine.txt": b"keep me"}
    assert sorted(p.name for p in local.iterdir()) == ["out"]


def test_a_missing_path_or_a_link_out_of_the_project_folder_is_refused_before_any_copy(node, tmp_path):
    source, local = node
    with pytest.raises(FatpipeError, match=r"n-0 \(local\): cannot pull out/nope\.pt: .*No such file"):
        fetch(source, "out/nope.pt", local / "nope.pt")
    (tmp_path / "secret").write_text("private key")
    (source.transport.home / "proj" / "leak").symlink_to(tmp_path / "secret")
    (source.transport.home / "proj" / "out" / "up").symlink_to(tmp_path)
    for rel in ("leak", "out/up/secret"):
        with pytest.raises(FatpipeError, match=f"{rel} resolves to .*secret, outside the project folder"):
            fetch(source, rel, local / rel)
    assert source.transport.copies == [] and list(local.iterdir()) == []


def test_a_node_sharing_this_machines_files_has_nothing_to_copy(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"x" * 10)
    source = NodeSource("n-0", LocalTransport("n-0"), str(tmp_path))
    got = fetch(source, "out", tmp_path / "out")
    assert got.here and got.size >= 10 and "is here already" in got.line(tmp_path)
    fetch(source, "out", tmp_path / "elsewhere" / "out")  # --to: a local copy
    assert tree(tmp_path / "elsewhere" / "out") == {"ckpt.pt": b"x" * 10}


@pytest.mark.parametrize(("args", "words"), [
    (["pull", "/etc/passwd"], "'/etc/passwd' must be relative"),
    (["pull", "demo", "../x"], "'../x' leaves the project folder"),
    (["pull", "demo"], "name what to pull from demo"),
    (["pull", "out", "--all", "--node", "demo-0"], "--node or --all"),
])
def test_the_command_refuses_bad_paths_in_one_line_exit_2(args, words, run_cli, project_dir):
    (project_dir / "fatpipe.toml").write_text(SIM)
    result = run_cli(*args)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 2 and len(errors) == 1 and words in errors[0], result.output
    assert sorted(p.name for p in project_dir.iterdir()) == ["fatpipe.toml"]
