"""All-reduce bandwidth sweep, small-message latency and node-to-node TCP throughput (torchrun entry).

    torchrun ... -m fatpipe.trainer.netbench --out netbench.json [--max-size 256M] [--quick]

Conventions are nccl-tests': for each size, `time` is the mean time of one all-reduce on the
slowest rank (per-rank times are all-reduced with MAX), algbw = size / time, and
busbw = algbw x 2(n-1)/n, the per-rank traffic of a ring all-reduce, which a link of B bytes/s
caps at B whatever n is. GB = 1e9 bytes; Gbit/s = GB/s x 8, since tiers are in Gbit/s.
Iteration counts are a pure function of the size, so every rank agrees on them (gloo fails
otherwise). Backend: NCCL when the node has a GPU, else gloo on float32 CPU tensors.

The p2p part runs between processes of this same job, one per node: the node at
`--p2p-server` (default: node 0) starts a server (iperf3 when every node has
it, else the built-in socket test of `fatpipe.trainer.p2p`), and every other node in turn sends
to it with 1 stream, then `--streams` streams, while the others wait at a barrier so no two
pairs share a link. Rank 0 writes one JSON document to `--out` and prints it on a line that
starts with `NETBENCH_JSON ` (for launchers that collect stdout from a remote node 0).

At module level this imports the standard library and `fatpipe.trainer.files` only, never
torch: `fatpipe netcheck` imports `parse_size` from it on machines without torch, and the
trainer shares its bandwidth arithmetic. The measuring code imports torch and the trainer's
allreduce, collectives, nic and p2p modules when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

from fatpipe.trainer.files import write_text_atomic

MiB = 1 << 20
DTYPE_BYTES = 4  # float32: what DDP's gradient buckets hold on CPU
RESULT_PREFIX = "NETBENCH_JSON "
LATENCY_BYTES = 4  # one float: the all-reduce is all latency, no bandwidth
# Timed iterations move about `bytes` per size, within [min, max]: many where they are cheap,
# few at 256 MiB, which takes ~3.2 s on 4 nodes at 1 Gbit/s. The quick sweep (up to 32 MiB)
# still times 4 at its top size: with 2, one stall of a busy CPU moved its result by 10 %.
ITERS_FULL = {"bytes": 256 * MiB, "min": 3, "max": 20}
ITERS_QUICK = {"bytes": 64 * MiB, "min": 4, "max": 10}


# --- the arithmetic (pure; tested against hand-computed values) ------------------------------


def parse_size(text: str | int) -> int:
    """Bytes from `268435456`, `256M`, `256MiB`, `64K` or `1G` (binary units, as nccl-tests)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size such as 1M, 256M or 1048576")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def sweep_sizes(min_size: int, max_size: int) -> list[int]:
    """Powers of two from `min_size` up to `max_size` (both included when `max_size` is one)."""
    if min_size < DTYPE_BYTES or max_size < min_size:
        raise ValueError(f"need {DTYPE_BYTES} <= min size <= max size, got {min_size}, {max_size}")
    sizes, size = [], min_size
    while size <= max_size:
        sizes.append(size)
        size *= 2
    return sizes


def iterations(size: int, quick: bool = False) -> tuple[int, int]:
    """(warm-up, timed) iterations for one size: a pure function, so every rank agrees."""
    rule = ITERS_QUICK if quick else ITERS_FULL
    timed = max(rule["min"], min(rule["max"], rule["bytes"] // size))
    warmup = max(1, min(5, timed // 4))
    return warmup, timed


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus factor 2(n-1)/n: bytes a rank sends per byte of the buffer."""
    return 2 * (world_size - 1) / world_size


def algbw_gbs(size: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes)."""
    return size / seconds / 1e9


def busbw_gbs(size: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: algbw x 2(n-1)/n."""
    return algbw_gbs(size, seconds) * bus_factor(world_size)


def sweep_row(size: int, seconds: float, world_size: int, warmup: int, iters: int) -> dict:
    """One line of the sweep, in nccl-tests' columns plus Gbit/s."""
    alg, bus = algbw_gbs(size, seconds), busbw_gbs(size, seconds, world_size)
    return {
        "size": size, "count": size // DTYPE_BYTES, "type": "float", "redop": "sum",
        "warmup": warmup, "iters": iters, "time_s": seconds,
        "algbw_gbs": alg, "busbw_gbs": bus, "algbw_gbps": alg * 8, "busbw_gbps": bus * 8,
    }


def format_table(rows: list[dict]) -> str:
    lines = [f"#{'size':>11} {'count':>10} {'type':>6} {'redop':>6} {'iters':>6} "
             f"{'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'busbw(Gbit/s)':>14}"]
    for r in rows:
        lines.append(f"{r['size']:>12} {r['count']:>10} {r['type']:>6} {r['redop']:>6} {r['iters']:>6} "
                     f"{r['time_s'] * 1e6:>11.1f} {r['algbw_gbs']:>12.3f} {r['busbw_gbs']:>12.3f} "
                     f"{r['busbw_gbps']:>14.3f}")
    return "\n".join(lines)


# --- measuring (needs an initialised process group) ------------------------------------------


class Bench:
    """The process group and the device the measurements share."""

    def __init__(self, device):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.device = torch, dist, device
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def barrier(self) -> None:
        from fatpipe.trainer.allreduce import barrier

        barrier(self.device)

    def timed(self, tensor, warmup: int, iters: int) -> float:
        """Mean seconds of one in-place all-reduce of `tensor` on the slowest rank."""
        from fatpipe.trainer.allreduce import timed_allreduce

        return timed_allreduce(tensor, warmup, iters, self.device)

    def check_sum(self) -> None:
        """One all-reduce of ones must give world_size everywhere, or the numbers mean nothing."""
        t = self.torch.ones(1024, dtype=self.torch.float32, device=self.device)
        self.dist.all_reduce(t)
        if not bool((t == self.world_size).all()):
            raise RuntimeError(f"all-reduce of ones gave {t[0].item()}, expected {self.world_size}")

    def latency(self, warmup: int = 20, iters: int = 200) -> float:
        t = self.torch.zeros(LATENCY_BYTES // DTYPE_BYTES, dtype=self.torch.float32, device=self.device)
        return self.timed(t, warmup, iters)

    def sweep(self, sizes: list[int], quick: bool = False, log=None) -> list[dict]:
        rows = []
        for size in sizes:
            warmup, iters = iterations(size, quick)
            # Zeros stay zeros under repeated sums: no overflow, and float speed does not
            # depend on the values for sums (no denormals).
            t = self.torch.zeros(size // DTYPE_BYTES, dtype=self.torch.float32, device=self.device)
            rows.append(sweep_row(size, self.timed(t, warmup, iters), self.world_size, warmup, iters))
            del t
            if log:
                log(format_table(rows[-1:]).splitlines()[-1])
        return rows


# --- where this process is --------------------------------------------------------------------


def node_ip() -> str:
    """This node's private IP: $FATPIPE_PRIVATE_IP (the launch path's node env), else the
    address of $GLOO_SOCKET_IFNAME, else the source address the kernel picks to reach the
    rendezvous host."""
    from fatpipe.trainer.nic import ipv4_address, source_address

    if os.environ.get("FATPIPE_PRIVATE_IP"):
        return os.environ["FATPIPE_PRIVATE_IP"]
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        name = os.environ.get(var, "").lstrip("=")
        if name and "," not in name and not name.startswith("^"):
            ip = ipv4_address(name)
            if ip:
                return ip
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    ip = source_address(host, socket.AF_INET)
    if ip is None:
        raise OSError(f"no IPv4 route to the rendezvous host {host}")
    return ip


def describe_ranks(bench: Bench) -> list[dict]:
    """Every rank's node, local rank, IP, name and whether the node has iperf3.

    `node` is the cluster's node index from the launch path's env (FATPIPE_NODE_RANK), else
    torchrun's GROUP_RANK: c10d rendezvous hands out group ranks in arrival order, so they need
    not match the cluster's node order.
    """
    from fatpipe.trainer import p2p

    group_rank = int(os.environ.get("GROUP_RANK", bench.rank))
    me = {
        "rank": bench.rank,
        "node": int(os.environ.get("FATPIPE_NODE_RANK", group_rank)),
        "group_rank": group_rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "ip": node_ip(),
        "name": os.environ.get("FATPIPE_NODE_NAME") or socket.gethostname(),
        "iperf3": p2p.have_iperf3(),
    }
    from fatpipe.trainer.collectives import all_gather_objects  # torch only: node venvs lack numpy

    return all_gather_objects(me, bench.device)


def node_leaders(ranks: list[dict]) -> list[dict]:
    """One rank per node (local rank 0), in the cluster's node order."""
    return sorted((r for r in ranks if r["local_rank"] == 0), key=lambda r: r["node"])


# --- p2p between nodes of this job ------------------------------------------------------------


def run_p2p(bench: Bench, ranks: list[dict], args) -> dict | None:
    """Node-to-server TCP throughput, one client node at a time; the result on every rank."""
    from fatpipe.trainer import p2p
    from fatpipe.trainer.collectives import all_gather_objects, broadcast_object

    nodes = node_leaders(ranks)
    if len(nodes) < 2:
        return None
    server = next((n for n in nodes if n["ip"] == args.p2p_server), nodes[0])
    clients = [n for n in nodes if n is not server]
    # Every node's iperf3 flag, this one's included, so every rank resolves the same tool.
    tool = p2p.resolve_tool(args.p2p_tool, peers_have_iperf3=all(n["iperf3"] for n in nodes))
    stream_counts = sorted({1, args.streams})
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


def _p2p_row(server: dict, client: dict, result: dict) -> dict:
    return {"server": server["name"], "server_ip": server["ip"], "client": client["name"],
            "client_ip": client["ip"], "client_node": client["node"], **result}


# --- the entry point -------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fatpipe.trainer.netbench", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument("--min-size", type=parse_size, default=MiB, help="smallest all-reduce (default 1M)")
    p.add_argument("--max-size", type=parse_size, default=256 * MiB, help="largest all-reduce (default 256M)")
    p.add_argument("--quick", action="store_true", help="fewer iterations (tests)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--timeout-s", type=float, default=300.0, help="process-group timeout")
    p.add_argument("--no-p2p", dest="p2p", action="store_false", help="skip the node-to-node test")
    p.add_argument("--p2p-server", default=None, help="private IP of the p2p server node (default: node 0)")
    p.add_argument("--p2p-port", type=int, default=5201)
    p.add_argument("--p2p-tool", choices=("auto", "iperf3", "socket"), default="auto")
    p.add_argument("--p2p-seconds", type=float, default=3.0)
    p.add_argument("--streams", type=int, default=4, help="parallel streams of the multi-stream test")
    args = p.parse_args(argv)
    if args.max_size < args.min_size:
        p.error("--max-size is below --min-size")
    return args


def init_process_group(backend: str, timeout_s: float):
    """Initialise from torchrun's environment; return the device the tensors live on."""
    import torch
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return device


def run(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    bench = Bench(init_process_group(args.backend, args.timeout_s))
    log = print if bench.rank == 0 else None
    ranks = describe_ranks(bench)
    bench.check_sum()
    p2p_result = run_p2p(bench, ranks, args) if args.p2p else None
    latency = bench.latency(iters=50 if args.quick else 200)
    if log:
        log(f"# {bench.world_size} ranks on {len(node_leaders(ranks))} nodes, "
            f"backend {bench.dist.get_backend()}, latency {latency * 1e6:.1f} us")
        log(format_table([]))
    rows = bench.sweep(sweep_sizes(args.min_size, args.max_size), args.quick, log=log)
    return {
        "kind": "fatpipe.netbench",
        "backend": bench.dist.get_backend(),
        "world_size": bench.world_size,
        "nnodes": len(node_leaders(ranks)),
        "ranks": ranks,
        "allreduce": rows,
        "busbw_gbps": rows[-1]["busbw_gbps"],
        "busbw_size": rows[-1]["size"],
        "latency_s": latency,
        "latency_bytes": LATENCY_BYTES,
        "p2p": p2p_result,
        "elapsed_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    args = parse_args(argv)
    try:
        result = run(args)
        if dist.get_rank() == 0:
            write_text_atomic(Path(args.out), json.dumps(result, indent=2) + "\n")
            print(RESULT_PREFIX + json.dumps(result, separators=(",", ":")), flush=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
