"""The hash cache: a file whose size, mtime, ctime and inode did not change is not read again; any change re-reads it."""

from __future__ import annotations

import json
import os

import pytest

import fatpipe.trainer.staging.hashcache as hc
from fatpipe.trainer.staging.hashcache import HashCache
from fatpipe.trainer.staging.manifest import build_manifest, hash_file, node_cache

CHUNK = 1 << 16


@pytest.fixture(autouse=True)
def settled(monkeypatch):
    monkeypatch.setattr(hc, "RACY_NS", 0)  # files here were written a moment ago


class Counting:
    """A hasher that counts which files it read."""

    def __init__(self):
        self.read: list[str] = []

    def __call__(self, path):
        self.read.append(os.path.basename(path))
        return hash_file(path, CHUNK)


def saved_and_reloaded(tmp_path, files: dict[str, bytes]) -> tuple[HashCache, Counting]:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    cache, hasher = HashCache(tmp_path / "cache.json", CHUNK), Counting()
    for name in files:
        cache.hashes(tmp_path / name, hasher)
    cache.save()
    return HashCache(tmp_path / "cache.json", CHUNK), Counting()


def test_an_unchanged_file_is_not_read_again_and_a_changed_one_is(tmp_path):
    old = os.urandom(3 * CHUNK)
    cache, hasher = saved_and_reloaded(tmp_path, {"same.bin": os.urandom(CHUNK), "changed.bin": old})
    new = bytearray(old)
    new[CHUNK + 5] ^= 0xFF
    (tmp_path / "changed.bin").write_bytes(bytes(new))  # same size, new content
    same = cache.hashes(tmp_path / "same.bin", hasher)
    changed = cache.hashes(tmp_path / "changed.bin", hasher)
    assert hasher.read == ["changed.bin"]
    assert same == hash_file(tmp_path / "same.bin", CHUNK)
    assert changed == hash_file(tmp_path / "changed.bin", CHUNK)


def test_content_changed_with_its_mtime_put_back_is_read_again(tmp_path):
    cache, hasher = saved_and_reloaded(tmp_path, {"f.bin": os.urandom(2 * CHUNK)})
    path = tmp_path / "f.bin"
    stat = path.stat()
    with open(path, "r+b") as f:
        f.write(b"\0" * 8)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime as before: ctime still moved
    assert cache.hashes(path, hasher) == hash_file(path, CHUNK) and hasher.read == ["f.bin"]


def test_a_replaced_file_is_read_again_and_another_chunk_size_starts_afresh(tmp_path):
    data = os.urandom(CHUNK)
    cache, hasher = saved_and_reloaded(tmp_path, {"f.bin": data})
    (tmp_path / "g.bin").write_bytes(data)
    os.replace(tmp_path / "g.bin", tmp_path / "f.bin")  # same bytes, another inode
    cache.hashes(tmp_path / "f.bin", hasher)
    assert hasher.read == ["f.bin"]
    assert HashCache(tmp_path / "cache.json", 2 * CHUNK).files == {}


def test_a_file_read_just_after_it_changed_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(hc, "RACY_NS", 10**12)  # it may change again within the same timestamp tick
    (tmp_path / "f.bin").write_bytes(os.urandom(CHUNK))
    cache = HashCache(tmp_path / "cache.json", CHUNK)
    cache.hashes(tmp_path / "f.bin", Counting())
    assert cache.files == {}


def test_an_unreadable_cache_is_ignored(tmp_path):
    (tmp_path / "cache.json").write_text("{not json")
    (tmp_path / "f.bin").write_bytes(b"abc")
    hasher = Counting()
    assert HashCache(tmp_path / "cache.json", CHUNK).hashes(tmp_path / "f.bin", hasher) == hash_file(
        tmp_path / "f.bin", CHUNK) and hasher.read == ["f.bin"]


def test_the_node_check_reads_only_changed_files_and_rehash_reads_all(tmp_path, monkeypatch, capsys):
    import fatpipe.trainer.staging.check as c
    import fatpipe.trainer.staging.manifest as m

    folder = tmp_path / "data" / "set"
    folder.mkdir(parents=True)
    for name in ("a.bin", "b.bin"):
        (folder / name).write_bytes(os.urandom(CHUNK + 3))
    manifest = build_manifest(folder, CHUNK, "data/set")
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    check = ["check", str(tmp_path / "m.json"), str(tmp_path)]
    assert c.main(check) == 0
    assert node_cache(manifest, tmp_path).path == folder / ".fatpipe-hashes.json"
    kept = json.loads((folder / ".fatpipe-hashes.json").read_text())["files"]
    assert sorted(os.path.basename(k) for k in kept) == ["a.bin", "b.bin"]

    read: list[str] = []
    real = m.hash_file
    monkeypatch.setattr(m, "hash_file", lambda path, *a, **k: read.append(path.name) or real(path, *a, **k))
    assert c.main(check) == 0 and read == []  # nothing changed: nothing read
    with open(folder / "b.bin", "r+b") as f:  # corrupted in place, size unchanged
        f.write(b"\xff\xfe")
    capsys.readouterr()
    assert c.main(check) == 1 and read == ["b.bin"]
    assert capsys.readouterr().out == "data/set/b.bin: chunk 0 differs from the manifest (sha256)\n"
    read.clear()
    assert c.main(["check", "--rehash", *check[1:]]) == 1 and read == ["a.bin", "b.bin"]
