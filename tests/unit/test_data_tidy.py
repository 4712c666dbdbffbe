"""A staged folder fatpipe claimed is exactly its manifest: extras named by the check, removed by a
push's check, the manifest kept beside what matches, the trainer reading only what it lists; and the chain never
writes into the inode of a file a trainer may have mapped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fatpipe.trainer.shards import listed_only
from fatpipe.trainer.staging.chainfiles import Files
from fatpipe.trainer.staging.check import PRUNED_PREFIX
from fatpipe.trainer.staging.manifest import (
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    RECORD_NAME,
    ChunkCheck,
    build_manifest,
    write_manifest,
)
from fatpipe.trainer.staging.record import Staged
from fatpipe.trainer.staging.stage import finish_files
from fatpipe.trainer.staging.tidy import extra_files, prune

CHUNK = 1 << 16


def staged(tmp_path, names=("a.bin", "b.bin", "sub/c.bin")):
    """A node's dataset folder fatpipe claimed (begun empty in its own project folder), then filled."""
    folder = tmp_path / "data" / "set"
    shell = {"kind": "folder", "path": "data/set", "files": []}
    Staged.begin(shell, tmp_path, own=True).save(shell, tmp_path)
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(os.urandom(1000))
    manifest = build_manifest(folder, CHUNK, "data/set")
    write_manifest(manifest, tmp_path)
    return folder, manifest


def check(tmp_path, manifest, *flags):
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    return subprocess.run([sys.executable, "-m", "fatpipe.trainer.staging.check", "check", *flags,
                           str(tmp_path / "m.json"), str(tmp_path)], capture_output=True, text=True)


def test_extras_are_named_by_verify_and_removed_by_a_push(tmp_path):
    folder, manifest = staged(tmp_path)
    assert extra_files(manifest, tmp_path) == [] and check(tmp_path, manifest).returncode == 0
    (folder / "old_003.bin").write_bytes(b"a shard the data no longer has")
    (folder / "stale").mkdir()
    (folder / "stale" / "x").write_bytes(b"x")
    (folder / "sub" / "d.bin").write_bytes(b"beside a listed one")
    (folder / "link").symlink_to("/etc/passwd")
    (folder / "a.bin.fatpipe-partial").write_bytes(b"a partial copy of a listed file: kept")
    (folder / "gone.bin.fatpipe-partial").write_bytes(b"of a file no longer listed: extra")
    (folder / "empty").mkdir()  # an empty folder holds no data: no extra, left alone
    extras = ["gone.bin.fatpipe-partial", "link", "old_003.bin", "stale/x", "sub/d.bin"]
    assert extra_files(manifest, tmp_path) == extras
    verify = check(tmp_path, manifest, "--rehash")
    assert verify.returncode == 1 and verify.stdout == (
        "data/set holds 5 file(s) the manifest does not list: gone.bin.fatpipe-partial, link, old_003.bin, "
        "stale/x, sub/d.bin\n")

    pushed = check(tmp_path, manifest, "--prune")
    assert pushed.returncode == 0, pushed.stdout
    assert json.loads(pushed.stdout.splitlines()[0].removeprefix(PRUNED_PREFIX)) == extras
    kept = sorted(p.name for p in folder.iterdir() if p.name != ".fatpipe-hashes.json")  # the cache: if settled
    assert kept == sorted([MANIFEST_NAME, RECORD_NAME, "a.bin", "a.bin.fatpipe-partial", "b.bin", "empty", "sub"])
    assert os.path.exists("/etc/passwd") and check(tmp_path, manifest).returncode == 0


def test_a_listed_file_that_is_a_link_is_a_difference_and_an_extra(tmp_path):
    folder, manifest = staged(tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes((folder / "a.bin").read_bytes())  # the right bytes, through a link
    (folder / "a.bin").unlink()
    (folder / "a.bin").symlink_to(outside)
    verify = check(tmp_path, manifest)
    assert verify.returncode == 1 and "data/set/a.bin: a symbolic link" in verify.stdout
    assert prune(manifest, tmp_path, Staged.read(manifest, tmp_path))[0] == ["a.bin"] and outside.exists() and not (folder / "a.bin").exists()


def test_a_push_keeps_the_new_manifest_beside_data_that_already_matches(tmp_path):
    folder, old = staged(tmp_path, ("train_000.bin", "train_001.bin", "train_002.bin"))
    (tmp_path / "src").mkdir()
    for name in ("train_000.bin", "train_001.bin"):  # re-tokenised: two of the three, unchanged
        (tmp_path / "src" / name).write_bytes((folder / name).read_bytes())
    new = build_manifest(tmp_path / "src", CHUNK, "data/set")
    done = check(tmp_path, new, "--prune")
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[0][len(PRUNED_PREFIX):]) == ["train_002.bin"]
    assert json.loads((folder / MANIFEST_NAME).read_text())["fingerprint"] == new["fingerprint"] != old["fingerprint"]


def test_the_trainer_reads_only_what_the_manifest_lists(tmp_path):
    from fatpipe.trainer.data import open_splits

    folder = tmp_path / "set"
    folder.mkdir()
    header = (20240520).to_bytes(4, "little") + (1).to_bytes(4, "little")
    for name, tokens in (("train_000.bin", 4000), ("train_001.bin", 4000), ("val.bin", 500)):
        body = bytes(range(256)) * (tokens * 2 // 256)
        (folder / name).write_bytes(header + (len(body) // 2).to_bytes(4, "little") + bytes(1012) + body)
    everything = open_splits(str(folder))[0]
    (folder / MANIFEST_NAME).write_text(json.dumps({"files": [{"name": "train_000.bin"}, {"name": "val.bin"}]}))
    train, val = open_splits(str(folder))
    assert len(everything.shards) == 2 and len(train.shards) == 1 and val is not None
    assert listed_only(folder, [folder / "train_001.bin"]) == []


def test_the_chain_patches_a_copy_so_a_mapped_file_keeps_its_bytes(tmp_path):
    """A node holding a file with one wrong chunk: the chain writes a new inode and renames it in;
    the old inode (what a running trainer maps) is never written."""
    source = tmp_path / "src"
    source.mkdir()
    good = os.urandom(3 * CHUNK + 17)
    (source / "train.bin").write_bytes(good)
    manifest = build_manifest(source, CHUNK, "data/set")
    folder = tmp_path / "data" / "set"
    folder.mkdir(parents=True)
    held = bytearray(good)
    held[CHUNK + 5] ^= 0xFF
    (folder / "train.bin").write_bytes(bytes(held))
    live = open(folder / "train.bin", "rb")  # the trainer's view: its inode
    inode = os.fstat(live.fileno()).st_ino
    files, chunk_check = Files(manifest, tmp_path), ChunkCheck(manifest)
    handle = files.partial(0)
    handle.seek(CHUNK)
    piece = good[CHUNK:2 * CHUNK]
    handle.write(piece)
    chunk_check.feed(0, CHUNK, piece)
    files.close()
    have = [[True, False, True, True]]
    assert finish_files(manifest, tmp_path, {0}, have, chunk_check, type("C", (), {"remember": lambda *a: None})()) is None
    assert (folder / "train.bin").read_bytes() == good and os.stat(folder / "train.bin").st_ino != inode
    live.seek(0)
    assert live.read() == bytes(held)  # the old inode kept its bytes
    live.close()
    assert not (folder / ("train.bin" + PARTIAL_SUFFIX)).exists()
