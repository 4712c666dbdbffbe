"""A remote name never writes outside the dataset folder: the one validator over a broad corpus, a
node's fetch from a hostile moto bucket, planted links, a local source's links, a tampered manifest."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest
from dataservers import s3_server

from fatpipe.trainer.staging import fetch as fetch_mod
from fatpipe.trainer.staging.fetch import fetch
from fatpipe.trainer.staging.manifest import build_manifest, file_target, write_manifest
from fatpipe.trainer.staging.names import UnsafeName, check_names, name_problem, writable_target

ESCAPE = f"dzu-escape-{uuid.uuid4().hex[:8]}"
CLIMB = "../" * 24
HOSTILE_NAMES = [
    "../x", "a/../../x", f"{CLIMB}tmp/x", "a/b/../../../x", "..", ".", "./x", "a/./b", "a/..",
    "/etc/passwd", "//x", "a//b", "a/", "", "a/b/", "\x00", "a\x00b", "a\nb", "a\rb", "a\tb", "a\x1bb",
    "a\x7fb", "a\u0085b", "a\u2028b", "a\u2029b", "evil\u202egnp.bin", "zero\u200bwidth", "bom\ufeff",
    "a\\..\\..\\x", "..\\x", "C:\\x", "a\udcffb", ".fatpipe-manifest.json", "sub/.fatpipe-hashes.json",
    "x.bin.fatpipe-partial", "x.bin.fatpipe-partial.etag", "x" * 256, "a/" + "b" * 256, ("d" * 200 + "/") * 21 + "f",
]
FINE_NAMES = ["train.bin", "a/b/c.bin", "..x", "x..", "...", "a..b/c", ".hidden", "\uff0e\uff0e/x",
              "a\u2215b", "\u2024\u2024", "\u00fcn\u00efcode.bin", "\u65e5\u672c.bin", "sp ace.bin", "-dash",
              "~tilde", "$HOME", "x" * 255, "emoji\U0001f600.bin", "a:b", "C:x"]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=ascii)
def test_a_name_that_could_leave_the_folder_is_refused(name):
    assert name_problem(name) is not None
    with pytest.raises(UnsafeName, match="nothing was written"):
        check_names([name], "s3://b/p")


@pytest.mark.parametrize("name", FINE_NAMES, ids=ascii)
def test_a_name_that_only_looks_odd_is_a_plain_name(name, tmp_path):
    assert name_problem(name) is None
    manifest = {"kind": "folder", "path": "data/set", "files": []}
    target = writable_target(tmp_path / "data" / "set", file_target(manifest, tmp_path, name))
    target.write_bytes(b"x")
    assert os.path.realpath(target).startswith(str(tmp_path / "data" / "set") + "/")


def test_duplicates_and_a_file_that_is_also_a_folder_are_refused():
    for names in (["a", "a"], ["a", "a/b"], ["x/y/z", "x/y"], ["x/y", "x/y/z/w"]):
        with pytest.raises(UnsafeName, match="s3://b/p"):
            check_names(names, "s3://b/p")
    assert check_names(["a/b", "a/c", "ab"], "s3://b/p")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HOSTILE_KEYS = {"climb": f"climb/{CLIMB}tmp/{ESCAPE}-1", "slash": f"slash//tmp/{ESCAPE}-2",
                "sub": f"sub/a/{CLIMB}tmp/{ESCAPE}-3", "dot": f"dot/./{ESCAPE}", "ctl": f"ctl/a\x01b{ESCAPE}",
                "bidi": "bidi/evil\u202egnp.bin", "bs": f"bs/..\\..\\{ESCAPE}", "own": "own/.fatpipe-manifest.json",
                "long": "long/" + "y" * 300, "clash": "clash/good.bin/inner"}
OBJECTS = {**{f"{p}/good.bin": b"harmless" for p in HOSTILE_KEYS}, **{k: b"hostile" for k in HOSTILE_KEYS.values()},
           "planted/sub/x.bin": b"real data", "planted/f.bin": b"real file", "planted/g.bin": b"g",
           "eq": b"the key equal to the prefix", "eq/": b"", "eq/a.bin": b"a", "eq/sub/": b"", "eq/sub/b.bin": b"b"}


@pytest.fixture(scope="module")
def bucket():
    port = free_port()
    server = s3_server("127.0.0.1", port, "hostile", OBJECTS)
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def node_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "node-own")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "node-own")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(fetch_mod, "RETRY_PAUSE_S", 0.01)


def spec(endpoint: str, prefix: str) -> dict:
    return {"source": f"s3://hostile/{prefix}", "path": "data/set", "chunk_size": 1 << 16,
            "endpoint_url": endpoint, "region": "us-east-1"}


def escaped(*roots) -> list[str]:
    found = subprocess.run(["find", "/tmp", *map(str, roots), "-name", f"*{ESCAPE}*"], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.parametrize("prefix", list(HOSTILE_KEYS))
def test_a_hostile_key_names_itself_and_its_source_and_writes_nothing(prefix, bucket, node_env, tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    with pytest.raises(UnsafeName) as refused:
        fetch(spec(bucket, prefix), root)
    line = str(refused.value)
    assert f"s3://hostile/{prefix}" in line and "\n" not in line and "nothing was written" in line
    if prefix != "clash":
        assert repr(HOSTILE_KEYS[prefix]) in line
    assert list(root.iterdir()) == [] and escaped(tmp_path) == []


def test_links_planted_in_a_node_folder_lead_no_write_or_read_outside(bucket, node_env, tmp_path):
    root, outside = tmp_path / "node", tmp_path / "outside"
    folder = root / "data" / "set"
    folder.mkdir(parents=True)
    outside.mkdir()
    (outside / "victim").write_bytes(b"untouched")
    (folder / "sub").symlink_to(outside)  # a folder component
    (folder / "f.bin").symlink_to(outside / "victim")  # the file itself
    (folder / "g.bin.fatpipe-partial").symlink_to(outside / "victim")  # its partial copy
    manifest = fetch(spec(bucket, "planted"), root, own=True)  # a node's project folder: fatpipe's
    assert sorted(os.listdir(outside)) == ["victim"] and (outside / "victim").read_bytes() == b"untouched"
    assert (folder / "sub" / "x.bin").read_bytes() == b"real data" and not (folder / "sub").is_symlink()
    assert (folder / "f.bin").read_bytes() == b"real file" and not (folder / "f.bin").is_symlink()
    assert sorted(f["name"] for f in manifest["files"]) == ["f.bin", "g.bin", "sub/x.bin"]


def test_a_key_equal_to_the_prefix_and_folder_markers_are_no_files(bucket, node_env, tmp_path):
    manifest = fetch(spec(bucket, "eq"), tmp_path)
    assert sorted(f["name"] for f in manifest["files"]) == ["a.bin", "sub/b.bin"]
    assert sorted(p.name for p in (tmp_path / "data" / "set").iterdir() if not p.name.startswith(".")) == ["a.bin", "sub"]


def test_a_planted_folder_link_is_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    base = tmp_path / "data" / "set"
    base.mkdir(parents=True)
    (base / "sub").symlink_to(outside)
    target = writable_target(base, base / "sub" / "deeper" / "x.bin")
    target.write_bytes(b"in")
    assert list(outside.iterdir()) == [] and (base / "sub").is_dir() and not (base / "sub").is_symlink()


def test_a_link_in_a_local_source_is_refused(tmp_path):
    (tmp_path / "secret").write_text("never copied")
    for i, target in enumerate((tmp_path / "secret", tmp_path, tmp_path / "missing")):
        source = tmp_path / f"src{i}"
        (source / "deep").mkdir(parents=True)
        (source / "good.bin").write_bytes(b"fine")
        (source / "deep" / "link").symlink_to(target)
        with pytest.raises(UnsafeName, match=r"deep/link is a symbolic link .*copies no links"):
            build_manifest(source, 1 << 20, "data/set")
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "a\nb").write_bytes(b"x")
    with pytest.raises(UnsafeName, match="control character"):
        build_manifest(odd, 1 << 20, "data/set")


@pytest.mark.parametrize("tamper", [{"name": f"{CLIMB}tmp/{ESCAPE}"}, {"name": "/tmp/" + ESCAPE},
                                    {"path": f"{CLIMB}tmp/{ESCAPE}"}, {"path": "/tmp/" + ESCAPE}])
def test_a_tampered_manifest_is_refused_by_the_check_and_the_chain(tamper, tmp_path):
    folder = tmp_path / "data" / "set"
    folder.mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"abc")
    manifest = build_manifest(folder, 1 << 20, "data/set")
    if "path" in tamper:
        manifest["path"] = tamper["path"]
    else:
        manifest["files"][0]["name"] = tamper["name"]
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    check = subprocess.run([sys.executable, "-m", "fatpipe.trainer.staging.check", "check", "--prune",
                            str(tmp_path / "m.json"), str(tmp_path)], capture_output=True, text=True)
    assert check.returncode == 1 and check.stdout.count("\n") == 1 and "unsafe" in check.stdout, check
    chain = subprocess.run([sys.executable, "-m", "fatpipe.trainer.staging.stage", "--manifest", str(tmp_path / "m.json")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert chain.returncode == 1 and "unsafe" in chain.stderr and "Traceback" not in chain.stderr, chain.stderr
    with pytest.raises(UnsafeName):
        write_manifest(manifest, tmp_path) if "path" in tamper else file_target(manifest, tmp_path, tamper["name"])
    assert escaped(tmp_path) == []
