"""netbench's node-to-node TCP round: every other node sends to one server node, in turn.

The node at `--p2p-server` (default: node 0) starts a server (iperf3 when every node has it,
else the built-in socket test of `fatpipe.trainer.net.p2p`), and every other node in turn sends to
it with 1 stream, then `--streams` streams, while the others wait at a barrier so no two pairs
share a link.
"""

from __future__ import annotations

from ..lazy import load
from . import p2p
from .nodes import node_leaders
from .sweep import Bench


def run_p2p(bench: Bench, ranks: list[dict], args) -> dict | None:
    """Node-to-server TCP throughput, one client node at a time; the result on every rank."""
    collectives = load("fatpipe.trainer.collectives")
    all_gather_objects, broadcast_object = collectives.all_gather_objects, collectives.broadcast_object
    nodes = node_leaders(ranks)
    if len(nodes) < 2:
        return None
    server = next((n for n in nodes if n["ip"] == args.p2p_server), nodes[0])
    clients = [n for n in nodes if n is not server]
    # Every node's iperf3 flag, this one's included, so every rank resolves the same tool.
    tool = p2p.resolve_tool(args.p2p_tool, peers_have_iperf3=all(n["iperf3"] for n in nodes))
    stream_counts = p2p_stream_counts(args)
    proc, problem = None, None
    if bench.rank == server["rank"]:
        proc = p2p.start_server(tool, server["ip"], args.p2p_port)
        problem = p2p.wait_listening(proc, server["ip"], args.p2p_port)
    problem = broadcast_object(problem, server["rank"], bench.device)  # every client learns if it is up
    mine: list[dict] = []
    try:
        for client in clients:
            bench.barrier()  # one pair at a time, so pairs never share a link
            if bench.rank != client["rank"]:
                continue
            if problem:
                mine += [_p2p_row(server, client, {"tool": tool, "streams": n, "error": problem})
                         for n in stream_counts]
                continue
            for streams in stream_counts:
                try:
                    r = p2p.run_client(tool, server["ip"], args.p2p_port, streams, args.p2p_seconds,
                                       bind=client["ip"])
                except Exception as e:  # report it; a raise here would leave the others waiting
                    r = {"tool": tool, "streams": streams, "error": str(e)}
                mine.append(_p2p_row(server, client, r))
        bench.barrier()
    finally:
        if proc is not None:
            p2p.stop_server(proc)
    gathered = all_gather_objects(mine, bench.device)
    results = [r for part in gathered for r in part]
    return {"tool": tool, "server_ip": server["ip"], "port": args.p2p_port,
            "seconds": args.p2p_seconds, "streams": stream_counts, "results": results}


def p2p_stream_counts(args) -> list[int]:
    """The stream counts each client sends with: 1 (what gloo gets per peer) and --streams, or
    --streams alone with --no-single-flow (the link's capacity, which the gate judges)."""
    return sorted({1, args.streams}) if getattr(args, "single_flow", True) else [args.streams]


def _p2p_row(server: dict, client: dict, result: dict) -> dict:
    return {"server": server["name"], "server_ip": server["ip"], "client": client["name"],
            "client_ip": client["ip"], "client_node": client["node"], **result}
