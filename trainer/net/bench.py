"""All-reduce bandwidth sweep, small-message latency and node-to-node TCP throughput (torchrun entry).

    torchrun ... -m fatpipe.trainer.net.bench --out netbench.json [--max-size 256M] [--quick]

Numbers follow nccl-tests' conventions (see `bandwidth`). Backend: NCCL when the node has a GPU,
else gloo on float32 CPU tensors. The p2p part (`netp2p`: node -> node 0; with `--pairs` also
`netpairs`: every node pair) runs between processes of this same job, one per node. Rank 0 writes
one JSON document to `--out` and prints it on a line that starts with `NETBENCH_JSON ` (for
launchers that collect stdout from a remote node 0).

At module level this and the modules it loads import the standard library and the trainer's
torch-free modules only, never torch: `fatpipe netcheck` imports `parse_size` from here on
machines without torch. The measuring code imports torch and the trainer's allreduce,
collectives, nic and p2p modules when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

from fatpipe.trainer.bandwidth import (
    DTYPE_BYTES,
    ITERS_FULL,
    ITERS_QUICK,
    LATENCY_BYTES,
    MiB,
    algbw_gbs,
    bus_factor,
    busbw_gbs,
    format_table,
    iterations,
    parse_size,
    sweep_row,
    sweep_sizes,
)
from fatpipe.trainer.files import write_text_atomic
from fatpipe.trainer.lazy import load
from fatpipe.trainer.net.nodes import describe_ranks, node_ip, node_leaders
from fatpipe.trainer.net.pairs import run_pairs
from fatpipe.trainer.net.sweep import Bench
from fatpipe.trainer.net.toserver import run_p2p

# Names other code and tests import from here, though they now live in the modules above.
__all__ = [
    "DTYPE_BYTES", "ITERS_FULL", "ITERS_QUICK", "LATENCY_BYTES", "MiB", "RESULT_PREFIX", "Bench",
    "algbw_gbs", "bus_factor", "busbw_gbs", "describe_ranks", "format_table", "iterations",
    "main", "node_ip", "node_leaders", "parse_args", "parse_size", "run", "run_p2p", "run_pairs", "sweep_row",
    "sweep_sizes",
]

RESULT_PREFIX = "NETBENCH_JSON "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fatpipe.trainer.net.bench", description=__doc__.split("\n")[0])
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
    p.add_argument("--no-single-flow", dest="single_flow", action="store_false",
                   help="p2p with --streams streams only, not also with one (a quick check's one run per node)")
    p.add_argument("--pairs", action="store_true",
                   help="also every node pair: throughput, latency and jitter (netpairs; port --p2p-port + 1 too)")
    args = p.parse_args(argv)
    if args.max_size < args.min_size:
        p.error("--max-size is below --min-size")
    return args


def init_process_group(backend: str, timeout_s: float):
    """Initialise from torchrun's environment; return the device the tensors live on."""
    torch, dist = load("torch"), load("torch.distributed")
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
    pairs_result = run_pairs(bench, ranks, args) if args.pairs else None
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
        "pairs": pairs_result,
        "elapsed_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    dist = load("torch.distributed")
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
    from ..exiting import run_and_exit

    run_and_exit(main)  # without finalization: gloo's threads would abort it (exiting.py)
