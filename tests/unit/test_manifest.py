"""The data manifest: sha256 per file and per chunk, streamed; differences named; the chain's plan."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from fatpipe.trainer.staging.manifest import (
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    build_manifest,
    first_difference,
    hash_file,
    held_chunks,
    manifest_target,
    write_manifest,
)
from fatpipe.trainer.staging.stage import plan

CHUNK = 1 << 20


def make_folder(root, sizes: dict[str, int]):
    folder = root / "data" / "set"
    for name, size in sizes.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return folder


def test_chunks_and_whole_file_hashes_match_hashlib(tmp_path):
    data = os.urandom(2 * CHUNK + 123)
    (tmp_path / "f").write_bytes(data)
    sha, chunks = hash_file(tmp_path / "f", CHUNK)
    assert sha == hashlib.sha256(data).hexdigest()
    assert chunks == [hashlib.sha256(data[i:i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)]
    assert hash_file(tmp_path / "f", CHUNK, limit=CHUNK)[1] == chunks[:1]


def test_a_folder_manifest_lists_every_file_sorted_and_skips_its_own_files(tmp_path):
    folder = make_folder(tmp_path, {"b.bin": 3 * CHUNK, "a/x.txt": 10, "empty": 0})
    (folder / MANIFEST_NAME).write_text("{}")
    (folder / ("b.bin" + PARTIAL_SUFFIX)).write_bytes(b"half")
    manifest = build_manifest(folder, CHUNK, "data/set")
    assert [f["name"] for f in manifest["files"]] == ["a/x.txt", "b.bin", "empty"]
    assert [len(f["chunks"]) for f in manifest["files"]] == [1, 3, 0]
    assert manifest["total_bytes"] == 3 * CHUNK + 10 and manifest["kind"] == "folder"
    assert first_difference(manifest, tmp_path) is None
    json.dumps(manifest)  # it is JSON


def test_unchanged_files_keep_their_hashes_without_reading(tmp_path, monkeypatch):
    import fatpipe.trainer.staging.hashcache as hc
    import fatpipe.trainer.staging.manifest as m
    from fatpipe.trainer.staging.hashcache import HashCache

    monkeypatch.setattr(hc, "RACY_NS", 0)  # the files were written a moment ago
    folder = make_folder(tmp_path, {"a": CHUNK})
    cache = HashCache(tmp_path / "hashes.json", CHUNK)
    first = build_manifest(folder, CHUNK, "data/set", cache=cache)
    cache.save()
    monkeypatch.setattr(m, "hash_file", lambda *a, **k: (_ for _ in ()).throw(AssertionError("hashed again")))
    assert build_manifest(folder, CHUNK, "data/set", cache=HashCache(tmp_path / "hashes.json", CHUNK)) == first


def test_a_corrupted_chunk_is_named_with_its_file(tmp_path):
    folder = make_folder(tmp_path, {"train.bin": 3 * CHUNK})
    manifest = build_manifest(folder, CHUNK, "data/set")
    with open(folder / "train.bin", "r+b") as f:
        f.seek(CHUNK + 5)
        f.write(b"\xff" if f.read(1) != b"\xff" else b"\x00")
    assert first_difference(manifest, tmp_path) == "data/set/train.bin: chunk 1 differs from the manifest (sha256)"
    assert held_chunks(manifest, tmp_path, manifest["files"][0]) == [True, False, True]
    (folder / "train.bin").unlink()
    assert first_difference(manifest, tmp_path) == "data/set/train.bin: missing"


def test_a_partial_copy_counts_its_right_chunks(tmp_path):
    folder = make_folder(tmp_path, {"train.bin": 3 * CHUNK})
    manifest = build_manifest(folder, CHUNK, "data/set")
    data = (folder / "train.bin").read_bytes()
    (folder / "train.bin").unlink()
    (folder / ("train.bin" + PARTIAL_SUFFIX)).write_bytes(data[:CHUNK + 10])
    assert held_chunks(manifest, tmp_path, manifest["files"][0]) == [True, False, False]


def test_a_single_file_keeps_its_manifest_beside_it(tmp_path):
    (tmp_path / "corpus.bin").write_bytes(os.urandom(100))
    manifest = build_manifest(tmp_path / "corpus.bin", CHUNK, "data/corpus.bin")
    assert manifest["kind"] == "file" and manifest["files"][0]["name"] == "corpus.bin"
    target = manifest_target(manifest, tmp_path)
    assert target == tmp_path / "data" / ("corpus.bin" + MANIFEST_NAME)
    write_manifest(manifest, tmp_path)
    assert json.loads(target.read_text()) == manifest


def test_the_node_check_is_one_line_and_exit_1(tmp_path):
    folder = make_folder(tmp_path, {"a": 10})
    manifest = build_manifest(folder, CHUNK, "data/set")
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    check = [sys.executable, "-m", "fatpipe.trainer.staging.check", "check", str(tmp_path / "m.json"), str(tmp_path)]
    assert subprocess.run(check, capture_output=True).returncode == 0
    (folder / "a").write_bytes(b"x")
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "data/set/a: 1 bytes, the manifest says 10\n"


def test_the_chain_moves_only_what_is_lacking_from_the_nearest_holder():
    manifest = {"chunk_size": 10, "files": [{"size": 25, "chunks": ["a", "b", "c"]}]}
    held = [[[True, True, True]], [[True, False, True]], [[True, True, True]], [[False, True, True]]]
    by_rank = [plan(manifest, held, r) for r in range(4)]
    # chunk 0: only rank 3 lacks it, so rank 2 (the holder before it) sends it; chunk 1: rank 1
    # lacks it, rank 0 sends it; chunk 2: nobody lacks it, nothing moves.
    assert [(t.tag, t.receive, t.write, t.send) for t in by_rank[0]] == [(2, False, False, True)]
    assert [(t.tag, t.receive, t.write, t.send) for t in by_rank[1]] == [(2, True, True, False)]
    assert [(t.tag, t.receive, t.write, t.send) for t in by_rank[2]] == [(1, False, False, True)]
    assert [(t.tag, t.offset, t.length, t.receive, t.write, t.send) for t in by_rank[3]] == [
        (1, 0, 10, True, True, False)]


def test_a_chain_relays_through_ranks_that_hold_a_chunk():
    manifest = {"chunk_size": 10, "files": [{"size": 5, "chunks": ["a"]}]}
    held = [[[True]], [[False]], [[True]], [[False]]]
    roles = [[(t.receive, t.write, t.send) for t in plan(manifest, held, r)] for r in range(4)]
    assert roles == [[(False, False, True)], [(True, True, True)], [(True, False, True)], [(True, True, False)]]


def test_a_chunk_travels_in_pieces_each_with_its_own_tag():
    manifest = {"chunk_size": 10, "files": [{"size": 25, "chunks": ["a", "b", "c"]}]}
    held = [[[True, True, True]], [[False, True, False]]]
    got = [(t.tag, t.offset, t.length) for t in plan(manifest, held, 1, piece_size=4)]
    # chunk 0: bytes 0-9 in pieces of 4, 4, 2 (tags 1-3); chunk 1 is held (tags 4-6 unused); chunk 2: 5 bytes
    assert got == [(1, 0, 4), (2, 4, 4), (3, 8, 2), (7, 20, 4), (8, 24, 1)]


def test_received_chunks_are_checked_as_their_pieces_arrive_and_a_wrong_one_is_not_renamed(tmp_path):
    from fatpipe.trainer.staging.hashcache import HashCache
    from fatpipe.trainer.staging.manifest import ChunkCheck
    from fatpipe.trainer.staging.stage import finish_files

    data = os.urandom(2 * CHUNK + 10)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.bin").write_bytes(data)
    manifest = build_manifest(tmp_path / "src" / "f.bin", CHUNK, "data/f.bin")
    check = ChunkCheck(manifest)
    piece = CHUNK // 4
    for at in range(0, len(data), piece):
        chunk_end = (at // CHUNK + 1) * CHUNK
        part = data[at:min(at + piece, chunk_end, len(data))]
        if at == CHUNK + piece:  # chunk 1 arrives with one byte flipped
            part = bytes([part[0] ^ 1]) + part[1:]
        check.feed(0, at, part)
    assert check.good == {(0, 0), (0, 2)}

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ("f.bin" + PARTIAL_SUFFIX)).write_bytes(data)
    cache = HashCache(tmp_path / "cache.json", CHUNK)
    problem = finish_files(manifest, tmp_path, {0}, [[False, False, False]], check, cache)
    assert problem == "f.bin: chunk 1 of the received copy does not match the manifest (sha256)"
    assert not (tmp_path / "data" / "f.bin").exists()
    assert finish_files(manifest, tmp_path, {0}, [[False, True, False]], check, cache) is None  # chunk 1 was held
    assert (tmp_path / "data" / "f.bin").read_bytes() == data and cache.files
