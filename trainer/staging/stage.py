"""The node side of `fatpipe data push`: a pipelined chain of chunks over the private links, no torch.

    python3 -m fatpipe.trainer.staging.stage --manifest M --place P --nodes N [--listen A | --from-operator] [--next A]

The operator starts it on every node at once (`ops.data.chain`, the modules sent with the command,
so a node needs no venv and nothing installed), naming each node's place in the chain, the address
it listens on and the next node's; the push's token comes in the environment (`chainlink.TOKEN_ENV`).
Place 0 is the chain's head, which holds the data: the operator itself (`ops.data.head`), linked to
the first node by that node's standard input and output (`--from-operator`), so the uplink is one
more link of the chain: node 0 writes and forwards each piece as it lands, and nothing reads the
data twice. Every node first hashes what it holds (a file, else its partial copy); what each holds
travels up the chain to place 0 and back down, so every place plans the same moves. A chunk travels
from the nearest place before its first taker that holds it, the node at place p receiving it from
p - 1 and forwarding it to p + 1 while it already receives the next pieces (`chainlink.move`). A
chunk travels in pieces of PIECE_SIZE, so a node forwards the start of a chunk before the rest
arrives (the chain's time hardly grows with its length) and holds BUFFERS pieces at most (memory
stays bounded whatever the data and chunk size). Only chunks some node lacks travel. A file is
written into `<file>.fatpipe-partial` and renamed once every chunk's sha256, checked as its pieces
arrive, matches the manifest (no second read), so an interrupted push leaves only partial files,
whose right chunks the next push keeps. A file held wrong is copied into a new partial file and
patched there, never written in place: a trainer that maps the old file keeps reading the old
inode. Every name is checked (`names`) before anything is written, and no write or read goes
through a link in the dataset folder. Place 0 has every place's report; a node at place 0 prints it
on one `STAGE_JSON ` line. Every node prints `STAGE_PROGRESS <place> <received> <to receive>` as it
goes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fatpipe.trainer.staging import chainlink
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
BUFFERS = 6  # pieces per node: up to four being received, two of its own read from disk while sent
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


def stage(manifest: dict, root: Path, args) -> dict:
    """This node's part of the chain; at place 0, every node's report (else this node's alone)."""
    place, last = args.place, args.nodes - 1
    deadline = time.monotonic() + args.timeout_s
    # Listening before anything else: the previous node retries its connection until this one is up.
    server = chainlink.listen(args.listen) if place > 0 and not args.from_operator else None
    cache = node_cache(manifest, root)
    links = [None, None]
    try:
        if place < last:
            links[1] = chainlink.connect_next(args.next, deadline)
        if server is not None:
            links[0] = chainlink.accept_previous(server, deadline)
            server.close()
        elif args.from_operator:
            links[0] = chainlink.StdioLink()
        held = [held_chunks(manifest, root, entry, cache) for entry in manifest["files"]]
        wait = deadline - time.monotonic()
        # What every node holds: gathered up the chain to place 0, then handed down to all.
        below = chainlink.recv_message(links[1], b"HELD", wait) if links[1] else []
        if links[0]:
            chainlink.send_message(links[0], b"HELD", [held, *below])
            everyone = chainlink.recv_message(links[0], b"ALL ", wait)
        else:
            everyone = [held, *below]
        if links[1]:
            chainlink.send_message(links[1], b"ALL ", everyone)
        if not all(all(chunks) for chunks in everyone[0]):
            raise SystemExit("fatpipe: place 0 does not hold every chunk of the data it should send")
        mine = stage_pieces(manifest, root, plan(manifest, everyone, place), held, cache, links, args)
        below = chainlink.recv_message(links[1], b"REPT", args.timeout_s) if links[1] else []
        if links[0]:
            chainlink.send_message(links[0], b"REPT", [mine, *below])
        return {"fingerprint": manifest["fingerprint"], "nodes": [mine, *below]}
    except (chainlink.ChainBroke, OSError) as e:
        raise SystemExit(f"fatpipe: the staging chain broke at place {place}: {e}") from None
    finally:
        for link in links:
            if link is not None:
                link.close()


def stage_pieces(manifest: dict, root: Path, tasks: list[Task], held: list[list[bool]], cache, links, args) -> dict:
    """Move this node's pieces, then rename what came right into place; this node's report."""
    to_receive = sum(t.length for t in tasks if t.receive)
    files, check, last = Files(manifest, root), ChunkCheck(manifest), [0.0]

    def progress(received: int, final: bool = False) -> None:
        if final or time.monotonic() - last[0] > PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            print(f"{PROGRESS_PREFIX}{args.place} {received} {to_receive}", flush=True)

    started = time.monotonic()
    progress(0, final=True)
    try:
        for f in needs_opening(manifest, root, held):
            files.partial(f)
        received = chainlink.move(tasks, files, check, links, progress, args.timeout_s, BUFFERS)
        touched = set(files.open)
    finally:
        files.close()
    progress(received, final=True)
    problem = finish_files(manifest, root, touched, held, check, cache)
    cache.save()
    if problem is None:
        write_manifest(manifest, root)
    return {"node": args.name or os.environ.get("FATPIPE_NODE_NAME", f"place-{args.place}"), "received": received,
            "files_written": len(touched), "problem": problem, "seconds": time.monotonic() - started,
            "peak_rss": peak_rss()}


def peak_rss() -> int | None:
    """This process's peak resident memory in bytes (VmHWM: since its exec, unlike rusage, which
    keeps the forking parent's); None where /proc does not say."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(prog="python -m fatpipe.trainer.staging.stage", description=__doc__.split("\n")[0])
    p.add_argument("--manifest", required=True, help="the manifest of the data to stage")
    p.add_argument("--place", type=int, default=0, help="this node's place in the chain (0: it holds the data)")
    p.add_argument("--nodes", type=int, default=1, help="the chain's length")
    p.add_argument("--listen", help="HOST:PORT this node listens on for the previous one (place > 0)")
    p.add_argument("--from-operator", action="store_true",
                   help="the previous place is the operator, on this program's standard input and output")
    p.add_argument("--next", help="HOST:PORT of the next node (all but the last place)")
    p.add_argument("--name", help="this node's name in the report")
    p.add_argument("--timeout-s", type=float, default=600.0, help="the longest wait for one piece")
    args = p.parse_args(argv)
    if not 0 <= args.place < args.nodes or (args.place > 0 and not (args.listen or args.from_operator)) or \
            (args.place < args.nodes - 1 and not args.next) or (args.from_operator and args.place != 1):
        p.error("every place but the first needs --listen (place 1 may take --from-operator), every place but the "
                "last --next")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        manifest = check_manifest(json.loads(Path(args.manifest).read_text()), args.manifest)
    except UnsafeName as e:
        raise SystemExit(f"fatpipe: {e}") from None
    result = stage(manifest, Path.cwd(), args)
    if args.place == 0:
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0 if all(n["problem"] is None for n in result["nodes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
