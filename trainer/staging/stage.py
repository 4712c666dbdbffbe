"""The node side of `fatpipe data push`: a pipelined chain of chunks over the private links (torchrun entry).

    torchrun ... -m fatpipe.trainer.staging.stage --manifest <run>/manifest.json

Run from the project folder, one process per node, gloo on the nodes' private interfaces. Every
rank first hashes what it holds (a file, else its partial copy) and the ranks all-gather which
chunks each lacks. The chain runs in the cluster's node order (FATPIPE_NODE_RANK, the node index:
node 0 holds the uplink's copy), not in torch's rank order, which c10d sorts by address. A chunk
travels from the nearest node before its first taker that holds it, the node at place p of the
chain receiving it from place p - 1 and forwarding it to p + 1 while it already receives the next
ones (isend/irecv). A chunk travels in pieces of PIECE_SIZE, so a rank forwards the start of a chunk
before the rest arrives (the chain's time hardly grows with its length) and holds BUFFERS pieces
at most (memory stays bounded whatever the data and chunk size). Only chunks some rank lacks travel. A file is written into `<file>.fatpipe-partial` and renamed once
every chunk's sha256, checked as its pieces arrive, matches the manifest (no second read), so an
interrupted push leaves only partial files, whose right chunks the next push keeps. A file held
wrong is copied into a new partial file and patched there, never written in place: a trainer that
maps the old file keeps reading the old inode. Every name is checked (`names`) before anything is
written, and no write or read goes through a link in the dataset folder. Rank 0 prints the outcome on one `STAGE_JSON ` line; every rank
prints `STAGE_PROGRESS <rank> <received> <to receive>` as it goes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fatpipe.trainer.staging.chainfiles import Files
from fatpipe.trainer.staging.manifest import (
    PARTIAL_SUFFIX,
    ChunkCheck,
    file_target,
    held_chunks,
    node_cache,
    write_manifest,
)
from fatpipe.trainer.staging.names import (
    UnsafeName,
    check_manifest,
)

RESULT_PREFIX = "STAGE_JSON "
PROGRESS_PREFIX = "STAGE_PROGRESS "
PIECE_SIZE = 4 << 20  # bytes per message: small enough to pipeline, large enough for full links
BUFFERS = 6  # pieces per rank: up to four being received, one written and forwarded, one still being sent
PROGRESS_EVERY_S = 0.5


@dataclass(frozen=True)
class Task:
    """This rank's part in moving one chunk: read it from disk or receive it; write it; forward it."""

    tag: int  # the piece's index over the whole data set: sender and receiver agree on it
    file: int
    offset: int
    length: int
    receive: bool
    write: bool
    send: bool


def node_index(rank: int) -> int:
    """This process's node in the cluster's order (the launch path's FATPIPE_NODE_RANK), else its rank."""
    return int(os.environ.get("FATPIPE_NODE_RANK", rank))


def chain_order(nodes: list[int]) -> list[int]:
    """The global ranks in the chain's order, by node index (`nodes[r]`: rank r's node)."""
    return sorted(range(len(nodes)), key=lambda r: (nodes[r], r))


def plan(manifest: dict, held: list[list[list[bool]]], place: int, piece_size: int = PIECE_SIZE) -> list[Task]:
    """The tasks of the chain's place `place`, a piece each, in the order every place walks the
    chunks. `held[r][f][c]`: place r holds chunk c of file f."""
    tasks, tag, size = [], 0, manifest["chunk_size"]
    per_chunk = -(-size // piece_size)
    for f, entry in enumerate(manifest["files"]):
        for c in range(len(entry["chunks"])):
            takers = [r for r in range(len(held)) if not held[r][f][c]]
            tag += 1
            if not takers:
                continue
            first, last = min(takers), max(takers)
            holders = [r for r in range(first) if held[r][f][c]]
            if not holders or not holders[-1] <= place <= last:
                continue
            source = holders[-1]
            length = min(size, entry["size"] - c * size)
            for p, at in enumerate(range(0, length, piece_size)):
                tasks.append(Task((tag - 1) * per_chunk + p + 1, f, c * size + at, min(piece_size, length - at),
                                  receive=place > source, write=place in takers, send=place < last))
    return tasks


def run_chain(tasks: list[Task], files: Files, check: ChunkCheck, peers: tuple[int, int], progress) -> int:
    """Move this rank's pieces, checking each chunk it writes as it comes; returns the bytes it received.
    `peers`: the global ranks before and after this one in the chain (-1 where there is none)."""
    import torch
    import torch.distributed as dist

    if not tasks:
        return 0
    longest = max(t.length for t in tasks)
    bufs = [torch.empty(longest, dtype=torch.uint8) for _ in range(min(BUFFERS, len(tasks)))]
    ahead = max(1, len(bufs) - 2)  # receives posted beyond the piece in hand; two buffers left to send from
    sends: dict[int, object] = {}
    recvs: dict[int, object] = {}
    received = 0

    def view(i: int):
        return bufs[i % len(bufs)][: tasks[i].length]

    def claim(i: int) -> None:  # the buffer of task i is free once task i - len(bufs) was sent
        work = sends.pop(i - len(bufs), None)
        if work is not None:
            work.wait()

    def post_receive(i: int) -> None:
        if i < len(tasks) and tasks[i].receive:
            claim(i)
            recvs[i] = dist.irecv(view(i), src=peers[0], tag=tasks[i].tag)

    for i in range(ahead):
        post_receive(i)
    for i, task in enumerate(tasks):
        post_receive(i + ahead)  # the next pieces arrive while this one is written and forwarded
        data = view(i)
        if task.receive:
            recvs.pop(i).wait()
            received += task.length
        else:
            claim(i)
            files.read(task, memoryview(data.numpy()))
        if task.write:
            handle = files.partial(task.file)
            handle.seek(task.offset)
            handle.write(memoryview(data.numpy()))
            check.feed(task.file, task.offset, memoryview(data.numpy()))
        if task.send:
            sends[i] = dist.isend(data, dst=peers[1], tag=task.tag)
        progress(received)
    for work in sends.values():
        work.wait()
    return received


def finish_files(manifest: dict, root: Path, touched: set[int], held: list[list[bool]], check: ChunkCheck,
                 cache) -> str | None:
    """Rename every partial copy into place once each chunk is right: held from the start, or received
    with its sha256 checked on arrival (so not read again); the hash cache remembers it. The first
    problem, if any."""
    for f in sorted(touched):
        entry = manifest["files"][f]
        target = file_target(manifest, root, entry["name"])
        wrong = [c for c in range(len(entry["chunks"])) if not held[f][c] and (f, c) not in check.good]
        if wrong:
            return f"{entry['name']}: chunk {wrong[0]} of the received copy does not match the manifest (sha256)"
        os.replace(target.with_name(target.name + PARTIAL_SUFFIX), target)
        cache.remember(target, entry["sha256"], entry["chunks"])
    return None


def needs_opening(manifest: dict, root: Path, held: list[list[bool]]) -> set[int]:
    """Files this rank must write or fix: a chunk lacking, or the file missing or of the wrong size."""
    out = set()
    for f, entry in enumerate(manifest["files"]):
        target = file_target(manifest, root, entry["name"])
        if not all(held[f]) or not target.is_file() or target.stat().st_size != entry["size"]:
            out.add(f)
    return out


def stage(manifest: dict, root: Path) -> dict:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    cache = node_cache(manifest, root)
    held = [held_chunks(manifest, root, entry, cache) for entry in manifest["files"]]
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (node_index(rank), held))
    ranks = chain_order([node for node, _ in everyone])
    place = ranks.index(rank)
    in_chain = [everyone[r][1] for r in ranks]
    if not all(all(chunks) for chunks in in_chain[0]):
        raise SystemExit("fatpipe: node 0 does not hold every chunk of the data it should send")
    tasks = plan(manifest, in_chain, place)
    peers = (ranks[place - 1] if place > 0 else -1, ranks[place + 1] if place + 1 < world else -1)
    to_receive = sum(t.length for t in tasks if t.receive)
    files, check, last = Files(manifest, root), ChunkCheck(manifest), [0.0]

    def progress(received: int, final: bool = False) -> None:
        if final or time.monotonic() - last[0] > PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            print(f"{PROGRESS_PREFIX}{rank} {received} {to_receive}", flush=True)

    started = time.monotonic()
    progress(0, final=True)
    try:
        for f in needs_opening(manifest, root, held):
            files.partial(f)
        received = run_chain(tasks, files, check, peers, progress)
        touched = set(files.open)
    finally:
        files.close()
    progress(received, final=True)
    problem = finish_files(manifest, root, touched, held, check, cache)
    cache.save()
    if problem is None:
        write_manifest(manifest, root)
    mine = {"node": os.environ.get("FATPIPE_NODE_NAME", f"rank-{rank}"), "received": received,
            "files_written": len(touched), "problem": problem, "seconds": time.monotonic() - started}
    report: list = [None] * world
    dist.all_gather_object(report, mine)
    return {"fingerprint": manifest["fingerprint"], "nodes": report}


def wait_for_source(ready: Path, wait_s: float) -> None:
    """Node 0's data arrives over the uplink while the chain starts: wait for the operator's word."""
    deadline = time.monotonic() + wait_s
    while not ready.is_file():
        if time.monotonic() > deadline:
            raise SystemExit(f"fatpipe: the copy to node 0 did not finish within {wait_s:.0f} s")
        time.sleep(0.2)
    word = ready.read_text().strip()
    if word != "ok":
        raise SystemExit(f"fatpipe: the copy to node 0 {word}")


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="python -m fatpipe.trainer.staging.stage", description=__doc__.split("\n")[0])
    p.add_argument("--manifest", required=True, help="the manifest of the data to stage")
    p.add_argument("--timeout-s", type=float, default=600.0, help="the longest wait for one chunk")
    p.add_argument("--source-ready", help="node 0 waits for this file (`ok`, or `failed: why`): the copy to node 0")
    p.add_argument("--wait-s", type=float, default=0.0, help="how long node 0 may wait for --source-ready")
    args = p.parse_args(argv)
    try:
        manifest = check_manifest(json.loads(Path(args.manifest).read_text()), args.manifest)
    except UnsafeName as e:
        raise SystemExit(f"fatpipe: {e}") from None
    wait = args.wait_s if args.source_ready else 0.0
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s + wait))
    try:
        if args.source_ready and node_index(dist.get_rank()) == 0:  # the node the copy reaches
            wait_for_source(Path(args.source_ready), wait)
        result = stage(manifest, Path.cwd())
        if dist.get_rank() == 0:
            print(RESULT_PREFIX + json.dumps(result), flush=True)
    finally:
        dist.destroy_process_group()
    return 0 if all(n["problem"] is None for n in result["nodes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
