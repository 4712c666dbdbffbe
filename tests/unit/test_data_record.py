"""A push deletes only what a record beside the data says fatpipe staged, and writes over nothing else.

A dataset folder of the user's (the project folder of nodes that share this machine's files, or a
`path` that held files before the first push): only the record's files go, none without one, and
a file fatpipe did not stage where the data goes stops the push with nothing written. A folder
fatpipe claimed (begun empty in a node's project folder) stays exactly its manifest. A `path`
that holds the source or lies inside it is refused before anything moves.
"""

from __future__ import annotations

import json
import os

import pytest

from fatpipe.infra.dataspec import DataSpec
from fatpipe.infra.errors import FatpipeError
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.trainer.staging.check import verdict
from fatpipe.trainer.staging.manifest import MANIFEST_NAME, RECORD_NAME, build_manifest
from fatpipe.trainer.staging.record import InTheWay

CHUNK = 1 << 16


def source(root, files: dict[str, bytes], name: str = "raw"):
    folder = root / name
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def stage(root, manifest: dict, src, own: bool = False) -> list[str]:
    """A push into `root` as `_stage_here` does it: make room, copy what is missing, check."""
    removed = verdict(manifest, root, tidy=True, own=own)[1]
    base = root / manifest["path"]
    for entry in manifest["files"]:
        (base / entry["name"]).parent.mkdir(parents=True, exist_ok=True)
        (base / entry["name"]).write_bytes((src / entry["name"]).read_bytes())
    problem, more = verdict(manifest, root, tidy=True, own=own)
    assert problem is None, problem
    return removed + more


def held(folder) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if not p.is_dir() and ".fatpipe-" not in p.name)


def test_in_a_folder_of_the_users_only_the_files_the_record_names_go(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("the user's")
    (data / "old").mkdir()
    (data / "old" / "x.bin").write_bytes(b"the user's too")
    src = source(tmp_path, {"a.bin": b"a" * 100, "b.bin": b"b" * 100, "sub/c.bin": b"c" * 10})
    first = build_manifest(src, CHUNK, "data")
    assert stage(tmp_path, first, src) == []
    record = json.loads((data / RECORD_NAME).read_text())
    assert record["claimed"] is False and record["files"] == ["a.bin", "b.bin", "sub/c.bin"]
    assert record["folders"] == ["sub"]

    (src / "b.bin").unlink()
    (src / "sub" / "c.bin").unlink()
    second = build_manifest(src, CHUNK, "data")
    # verify names what a push would remove, never the user's files
    assert verdict(second, tmp_path)[0] == "data holds 2 file(s) the manifest does not list: b.bin, sub/c.bin"
    assert stage(tmp_path, second, src) == ["b.bin", "sub/c.bin"]
    assert held(data) == ["a.bin", "notes.txt", "old/x.bin"] and not (data / "sub").exists()
    assert json.loads((data / MANIFEST_NAME).read_text())["fingerprint"] == second["fingerprint"]


def test_without_a_record_nothing_is_removed(tmp_path):
    data = source(tmp_path, {"a.bin": b"a" * 10, "stale.bin": b"an earlier copy, or the user's"}, "data")
    src = source(tmp_path, {"a.bin": b"a" * 10})
    manifest = build_manifest(src, CHUNK, "data")
    (data / MANIFEST_NAME).write_text(json.dumps(build_manifest(data, CHUNK, "data")))  # no record beside it
    assert verdict(manifest, tmp_path, tidy=True, own=True) == (None, [])  # it held files: not fatpipe's alone
    assert held(data) == ["a.bin", "stale.bin"]
    (data / RECORD_NAME).write_text("{not json")  # unreadable: as good as none
    assert verdict(manifest, tmp_path) == (None, []) and verdict(manifest, tmp_path, tidy=True)[1] == []
    assert held(data) == ["a.bin", "stale.bin"]


def test_a_folder_fatpipe_claimed_stays_exactly_its_manifest(tmp_path):
    src = source(tmp_path, {"a.bin": b"a" * 10})
    manifest = build_manifest(src, CHUNK, "data/set")
    stage(tmp_path, manifest, src, own=True)  # begun absent in a node's own project folder
    data = tmp_path / "data" / "set"
    (data / "by-hand.bin").write_bytes(b"put there by hand")
    assert verdict(manifest, tmp_path)[0] == "data/set holds 1 file(s) the manifest does not list: by-hand.bin"
    assert verdict(manifest, tmp_path, tidy=True, own=True) == (None, ["by-hand.bin"])
    assert held(data) == ["a.bin"]


def test_a_file_fatpipe_did_not_stage_where_the_data_goes_stops_the_push(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"the user's own a.bin")
    (data / "same.bin").write_bytes(b"s" * 10)
    (data / "sub").write_bytes(b"a file where the data needs a folder")
    (tmp_path / "elsewhere").write_bytes(b"untouched")
    (data / "link.bin").symlink_to(tmp_path / "elsewhere")
    src = source(tmp_path, {"a.bin": b"new", "same.bin": b"s" * 10, "sub/c.bin": b"c", "link.bin": b"l"})
    manifest = build_manifest(src, CHUNK, "data")
    before = {p: p.read_bytes() for p in data.iterdir()}
    with pytest.raises(InTheWay) as refused:
        verdict(manifest, tmp_path, tidy=True, own=True)
    assert str(refused.value) == ("data holds 3 file(s) fatpipe did not stage where the data goes: a.bin, link.bin, "
                                  "sub; nothing was written: move it away, or choose another [data] path")
    assert {p: p.read_bytes() for p in data.iterdir()} == before and not (data / RECORD_NAME).exists()

    for name in ("a.bin", "sub", "link.bin"):
        os.unlink(data / name)
    stage(tmp_path, manifest, src)
    assert json.loads((data / RECORD_NAME).read_text())["files"] == ["a.bin", "link.bin", "sub/c.bin"]
    (src / "same.bin").unlink()  # the user's identical file was never fatpipe's: it stays
    assert stage(tmp_path, build_manifest(src, CHUNK, "data"), src) == []
    assert (data / "same.bin").read_bytes() == b"s" * 10 and (tmp_path / "elsewhere").read_bytes() == b"untouched"


def test_a_name_the_record_forgot_is_not_fatpipes_when_it_comes_back(tmp_path):
    src = source(tmp_path, {"a.bin": b"a", "b.bin": b"b"})
    stage(tmp_path, build_manifest(src, CHUNK, "data"), src)
    (tmp_path / "data" / "b.bin").unlink()  # the user removed the staged copy
    (src / "b.bin").unlink()
    stage(tmp_path, build_manifest(src, CHUNK, "data"), src)
    (tmp_path / "data" / "b.bin").write_bytes(b"the user's new b.bin")
    assert stage(tmp_path, build_manifest(src, CHUNK, "data"), src) == []
    assert (tmp_path / "data" / "b.bin").read_bytes() == b"the user's new b.bin"


def test_a_single_file_is_written_over_only_when_fatpipe_staged_it(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.bin").write_bytes(b"the user's")
    src = source(tmp_path, {"corpus.bin": b"x" * 50})
    manifest = build_manifest(src / "corpus.bin", CHUNK, "data/train.bin")
    with pytest.raises(InTheWay, match="data/train.bin is a file fatpipe did not stage; nothing was written"):
        verdict(manifest, tmp_path, tidy=True)
    (tmp_path / "data" / "train.bin").unlink()
    verdict(manifest, tmp_path, tidy=True)
    (tmp_path / "data" / "train.bin").write_bytes(b"x" * 50)
    (src / "corpus.bin").write_bytes(b"y" * 50)  # changed: fatpipe's own copy is replaced
    assert verdict(build_manifest(src / "corpus.bin", CHUNK, "data/train.bin"), tmp_path, tidy=True)[1] == []
    assert json.loads((tmp_path / "data" / ("train.bin" + RECORD_NAME)).read_text())["files"] == ["train.bin"]


@pytest.mark.parametrize("src,path,words", [
    ("data/raw", "data", "data path 'data' holds the source 'data/raw'"),
    ("data", "data/tok", "data path 'data/tok' lies inside the source 'data'"),
    ("data/raw/a.bin", "data/raw", "data path 'data/raw' holds the source 'data/raw/a.bin'"),
    ("../proj/data/raw", "data", "data path 'data' holds the source '../proj/data/raw'"),
    ("data/raw", "staged", "holds the source 'data/raw' (links resolved"),  # staged -> data
    ("raw-link", "data/raw/x", "lies inside the source 'raw-link' (links resolved"),  # raw-link -> data/raw
])
def test_a_path_that_holds_the_source_or_lies_inside_it_is_refused(tmp_path, src, path, words):
    from fatpipe.ops.data.stage import refuse_overlap

    root = tmp_path / "proj"
    (root / "data" / "raw").mkdir(parents=True)
    (root / "data" / "raw" / "a.bin").write_bytes(b"a")
    (root / "staged").symlink_to(root / "data")
    (root / "raw-link").symlink_to(root / "data" / "raw")
    with pytest.raises(FatpipeError) as refused:
        refuse_overlap(DataSpec(source=src, path=path), root)
    assert refused.value.exit_code == 2 and words in str(refused.value) and "\n" not in str(refused.value)
    for fine in (DataSpec(source="data/raw"), DataSpec(source="data/raw", path="data/staged"),
                 DataSpec(source="raw-link", path="data/raw")):  # the same folder: the data itself
        refuse_overlap(fine, root)


def shared_push(project_dir, data_toml: str):
    """`push_data` on a 2-node cluster whose nodes share this machine's files (loopback)."""
    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.infra.project import load_project
    from fatpipe.ops.data.stage import push_data

    (project_dir / "fatpipe.toml").write_text(f'[clusters.demo]\nprovider = "sim"\nnodes = 2\n[data]\n{data_toml}')
    outputs = parse_outputs({"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
                             "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}",
                                        "transport": "local"} for i in range(2)]})
    return push_data(Cluster.resolve(load_project(), "demo", outputs))


def test_a_push_on_nodes_sharing_this_machines_files_keeps_the_users_files(project_dir):
    data = project_dir / "data"
    (data / "raw").mkdir(parents=True)
    (data / "notes.txt").write_text("the user's notes")
    (data / "raw" / "a.bin").write_bytes(b"a" * 1000)
    with pytest.raises(FatpipeError, match="data path 'data' holds the source 'data/raw'") as refused:
        shared_push(project_dir, 'source = "data/raw"\npath = "data"\n')
    assert refused.value.exit_code == 2
    assert held(data) == ["notes.txt", "raw/a.bin"] and (data / "raw" / "a.bin").read_bytes() == b"a" * 1000

    (project_dir / "raw").mkdir()
    for name in ("a.bin", "b.bin"):
        (project_dir / "raw" / name).write_bytes(name.encode() * 100)
    first = shared_push(project_dir, 'source = "raw"\npath = "data"\n')
    assert first.removed == {} and held(data) == ["a.bin", "b.bin", "notes.txt", "raw/a.bin"]
    (project_dir / "raw" / "b.bin").unlink()
    second = shared_push(project_dir, 'source = "raw"\npath = "data"\n')
    assert second.removed == {"demo-0": ["b.bin"]} and held(data) == ["a.bin", "notes.txt", "raw/a.bin"]
