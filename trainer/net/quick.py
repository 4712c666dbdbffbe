"""The quick link check on one node, standard library only: no torch, no torchrun, no venv.

    python3 -c <node/databoot.py> (this module and its neighbours come on the standard input)

Every node runs it at once (`fatpipe.ops.net.quick`), told its place, the address it listens on
and the next node's. Over a ring of TCP sockets (`ring`) the nodes check one all-reduce, time a
small one (latency) and the tier's size (busbw, in nccl-tests' conventions: `bandwidth`), then
each node in turn sends to node 0 for a second over several streams (iperf3 where every node has
it, else the built-in socket test), its turn handed on round the ring. Node 0 prints the result
on one line starting `NETBENCH_JSON `, in netbench's shape (`fatpipe.trainer.net.bench`), so
netcheck judges and records both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time

from fatpipe.trainer.bandwidth import LATENCY_BYTES, format_table, iterations, sweep_row
from fatpipe.trainer.net import p2p
from fatpipe.trainer.net.p2psocket import serve
from fatpipe.trainer.net.ring import PIECE, Ring, RingBroke, xor

RESULT_PREFIX = "NETBENCH_JSON "
TOKEN_ENV = "FATPIPE_NETCHECK_TOKEN"  # every node's connection proves it belongs to this check
BACKEND = "tcp"  # what netcheck.json's `backend` says of this measurement
LATENCY_ITERS = 50


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fatpipe.trainer.net.quick")
    p.add_argument("--place", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--listen", type=address, required=True, help="this node's private address:port")
    p.add_argument("--next", type=address, required=True, help="the next node's private address:port")
    p.add_argument("--size", type=int, required=True, help="the timed all-reduce's bytes")
    p.add_argument("--p2p-port", type=int, required=True)
    p.add_argument("--p2p-tool", choices=p2p.TOOLS, default="auto")
    p.add_argument("--p2p-seconds", type=float, default=1.0)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=120.0)
    return p.parse_args(argv)


def fill(place: int, size: int) -> bytes:
    """Node `place`'s bytes for the checked all-reduce: different at every offset and node."""
    return random.Random(place).getrandbits(8 * size).to_bytes(size, "little")


def check(ring: Ring, place: int, nodes: int) -> None:
    """One all-reduce with XOR, against the XOR of every node's bytes (a few pieces a chunk and
    a part-piece: every step of the schedule)."""
    size = nodes * (2 * PIECE + 4099)
    buf = bytearray(fill(place, size))
    ring.allreduce(buf, place, nodes, reduce=True)
    expected = fill(0, size)
    for other in range(1, nodes):
        expected = xor(expected, fill(other, size))
    if not all(ring.circulate(place, bytes(buf) == expected)):
        raise RingBroke("the checked all-reduce came out wrong on a node")


def timed(ring: Ring, place: int, nodes: int, size: int, warmup: int, iters: int) -> float:
    """Seconds of one all-reduce of `size` bytes (rounded up to whole chunks), after `warmup`."""
    buf = bytearray(-(-size // nodes) * nodes)
    for _ in range(warmup):
        ring.allreduce(buf, place, nodes, reduce=False)
    ring.circulate(place, None)  # every node starts the timed ones together
    start = time.perf_counter()
    for _ in range(iters):
        ring.allreduce(buf, place, nodes, reduce=False)
    return (time.perf_counter() - start) / iters


def p2p_server(tool: str, ip: str, port: int, sessions: int):
    """Start node 0's server; (stop, the problem or None)."""
    if tool == "iperf3":
        proc = p2p.start_server(tool, ip, port)
        return (lambda: p2p.stop_server(proc)), p2p.wait_listening(proc, ip, port)
    ready, problem = threading.Event(), []

    def run() -> None:
        try:
            serve(ip, port, sessions=sessions, idle_timeout=60, ready=ready.set)
        except OSError as e:
            problem.append(f"the server could not listen on {ip}:{port} ({e})")
            ready.set()

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return (lambda: None), (problem[0] if problem else None if ready.is_set() else "the server did not start")


def p2p_turns(ring: Ring, place: int, everyone: list[dict], tool: str, args) -> list[dict]:
    """Each node but 0 in turn sends to node 0 (its turn comes round the ring); the rows, on node 0."""
    server = everyone[0]
    if place == 0:
        stop, problem = p2p_server(tool, server["ip"], args.p2p_port, len(everyone) - 1)
        try:
            ring.send({"problem": problem, "rows": []})
            return ring.recv()["rows"]
        finally:
            stop()
    turn = ring.recv()
    me = everyone[place]
    row = {"server": server["name"], "server_ip": server["ip"], "client": me["name"], "client_ip": me["ip"],
           "client_node": place, "tool": tool, "streams": args.streams}
    if turn["problem"]:
        row["error"] = turn["problem"]
    else:
        try:
            row.update(p2p.run_client(tool, server["ip"], args.p2p_port, args.streams, args.p2p_seconds,
                                      bind=me["ip"]))
        except Exception as e:  # reported in the row; a raise would leave node 0 waiting
            row["error"] = str(e)
    turn["rows"].append(row)
    ring.send(turn)
    return []


def measure(args) -> dict | None:
    """The whole check on this node; the result on node 0 (None elsewhere)."""
    start, nodes, place = time.perf_counter(), args.nodes, args.place
    ip = args.listen[0]
    ring = Ring(args.listen, args.next, os.environ.get(TOKEN_ENV, ""), args.timeout_s)
    try:
        everyone = ring.circulate(place, {"name": args.name, "ip": ip, "iperf3": p2p.have_iperf3()})
        tool = p2p.resolve_tool(args.p2p_tool, all(node["iperf3"] for node in everyone))
        check(ring, place, nodes)
        latency = timed(ring, place, nodes, nodes * LATENCY_BYTES, 1, LATENCY_ITERS)
        warmup, iters = iterations(args.size, quick=True)
        seconds = timed(ring, place, nodes, args.size, warmup, iters)
        slowest = ring.circulate(place, [seconds, latency])  # nccl-tests: the slowest rank's time
        rows = p2p_turns(ring, place, everyone, tool, args)
    finally:
        ring.close()
    if place != 0:
        return None
    row = sweep_row(args.size, max(s for s, _ in slowest), nodes, warmup, iters)
    print(f"# {nodes} nodes, one process each, a ring of TCP sockets, latency "
          f"{max(lat for _, lat in slowest) * 1e6:.1f} us\n{format_table([row])}", flush=True)
    ranks = [{"rank": i, "node": i, "name": n["name"], "ip": n["ip"], "iperf3": n["iperf3"]}
             for i, n in enumerate(everyone)]
    return {"kind": "fatpipe.netbench", "backend": BACKEND, "world_size": nodes, "nnodes": nodes,
            "ranks": ranks, "allreduce": [row], "busbw_gbps": row["busbw_gbps"], "busbw_size": args.size,
            "latency_s": max(lat for _, lat in slowest), "latency_bytes": LATENCY_BYTES,
            "p2p": {"tool": tool, "server_ip": everyone[0]["ip"], "port": args.p2p_port,
                    "seconds": args.p2p_seconds, "streams": [args.streams], "results": rows},
            "pairs": None, "elapsed_s": time.perf_counter() - start}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.nodes < 2:
        print(f"{args.name}: the quick check needs two nodes or more", flush=True)
        return 2
    try:
        result = measure(args)
    except (RingBroke, OSError) as e:
        print(f"{args.name}: the quick check's ring broke: {e}", flush=True)
        return 1
    if result is not None:
        print(RESULT_PREFIX + json.dumps(result, separators=(",", ":")), flush=True)
    return 0
