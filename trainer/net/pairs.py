"""netbench's every-pair round (`--pairs`): throughput, latency and jitter of every node pair.

Pairs are scheduled as a round-robin tournament (`round_robin`): each round is a set of pairs
that share no node, so they run at the same time without sharing a link, and a barrier
separates the rounds. Every node runs a throughput server (the same tool as the node -> node 0
round, `fatpipe.trainer.net.p2p`) and an echo listener (`p2plat`); in each pair the higher-indexed
node is the client: first many small round trips (latency on an idle link), then the
throughput runs.
"""

from __future__ import annotations

from ..lazy import load
from . import p2p
from .nodes import node_leaders
from .p2plat import EchoServer, rtt_samples, rtt_stats
from .sweep import Bench


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Every unordered pair of 0..n-1 exactly once, in rounds of pairs that share no node.

    The circle method: n - 1 rounds for even n, n for odd n (one node sits each round out).
    Each pair is (lower, higher).
    """
    if n < 2:
        return []
    slots: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(slots)
    rounds = []
    for _ in range(m - 1):
        pairs = [(slots[i], slots[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        slots = [slots[0], slots[-1], *slots[1:-1]]  # hold the first, turn the rest one place
    return rounds


def run_pairs(bench: Bench, ranks: list[dict], args) -> dict | None:
    """Every pair of nodes, round by round; the result on every rank (None below 2 nodes)."""
    all_gather_objects = load("fatpipe.trainer.collectives").all_gather_objects
    nodes = node_leaders(ranks)
    if len(nodes) < 2:
        return None
    tool = p2p.resolve_tool(args.p2p_tool, peers_have_iperf3=all(n["iperf3"] for n in nodes))
    me = next((n for n in nodes if n["rank"] == bench.rank), None)  # None: not a node's leader
    proc = echo = problem = None
    if me is not None:
        proc, echo, problem = _start_servers(tool, me["ip"], args.p2p_port)
    # Which servers are up, on every rank, so a client facing a dead one reports it and moves on.
    problems = dict(enumerate(all_gather_objects(problem, bench.device)))
    schedule = round_robin(len(nodes))
    mine: list[dict] = []
    try:
        for number, pairs in enumerate(schedule):
            bench.barrier()  # a round starts when the last one has ended everywhere
            for i, j in pairs:
                server, client = nodes[i], nodes[j]
                if bench.rank == client["rank"]:
                    mine.append(_measure(tool, server, client, args, problems.get(server["rank"]))
                                | {"round": number})
        bench.barrier()
    finally:
        if echo is not None:
            echo.close()
        if proc is not None:
            p2p.stop_server(proc)
    links = [r for part in all_gather_objects(mine, bench.device) for r in part]
    return {"tool": tool, "port": args.p2p_port, "latency_port": args.p2p_port + 1,
            "seconds": args.p2p_seconds, "streams": sorted({1, args.streams}),
            "rounds": [[[nodes[i]["name"], nodes[j]["name"]] for i, j in pairs] for pairs in schedule],
            "links": sorted(links, key=lambda r: (r["a_node"], r["b_node"]))}


def _start_servers(tool: str, ip: str, port: int):
    """This node's throughput server on `port` and echo listener on `port + 1`, and any problem."""
    proc = p2p.start_server(tool, ip, port)
    problem = p2p.wait_listening(proc, ip, port)
    try:
        echo = EchoServer(ip, port + 1)
    except OSError as e:
        echo, problem = None, problem or f"the echo listener on {ip}:{port + 1}: {e}"
    return proc, echo, problem


def _measure(tool: str, server: dict, client: dict, args, problem: str | None) -> dict:
    """One pair from the client's side; failures are reported in the row, never raised (a raise
    would leave every other rank waiting at the next barrier)."""
    row = {"a": server["name"], "a_ip": server["ip"], "a_node": server["node"],
           "b": client["name"], "b_ip": client["ip"], "b_node": client["node"],
           "tool": tool, "gbps_by_streams": {}, "error": None}
    if problem:
        return row | {"error": f"{server['name']}: {problem}"}
    errors = []
    try:
        count = 50 if args.quick else 200
        row |= rtt_stats(rtt_samples(server["ip"], args.p2p_port + 1, count, bind=client["ip"]))
    except Exception as e:
        errors.append(f"latency: {e}")
    for streams in sorted({1, args.streams}):
        try:
            r = p2p.run_client(tool, server["ip"], args.p2p_port, streams, args.p2p_seconds,
                               bind=client["ip"])
            row["gbps_by_streams"][str(streams)] = r["gbps"]
        except Exception as e:
            errors.append(f"{streams} stream(s): {e}")
    return row | {"error": "; ".join(errors) or None}
