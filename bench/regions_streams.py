"""The exchange between regions over one connection per shard against several, on a link that caps
each flow: a 4-node sim cluster in 2 regions joined by a 0.4 Gbit/s link whose flows are capped at
0.1 (cross_region_flow_gbps, as a provider or a long link's window caps one flow).

Each node's rank runs in its own namespace and exchanges a tensor of --mb MB between the regions
as the trainer does (`trainer.comm.regions.CrossExchange`: int8 shards, one per rank of a region),
first over 1 stream per shard, then over `streams` (what the launch derives from netcheck's
one-flow and several-flow rates). Prints the seconds of each and the ratio; writes
bench/results/regions_streams.json. Needs root and terraform.

    sudo .venv/bin/python bench/regions_streams.py [--mb 8] [--streams 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CLUSTER, CIDR, PORT = "rg-streams", "10.86.0.0/24", 29731
CROSS, FLOW = 0.4, 0.1

# One rank: the trainer's layout and exchange, timed over `iters` exchanges after a warm-up.
_RANK = r"""
import json, os, sys, time, torch, torch.distributed as dist
from fatpipe.trainer.comm.regions import CrossExchange, region_layout
rank, world, streams, mb, iters = (int(a) for a in sys.argv[1:6])
dist.init_process_group("gloo", rank=rank, world_size=world)
layout = region_layout(torch.device("cpu"), os.environ["FATPIPE_REGION"], streams)
exchange = CrossExchange(layout, torch.device("cpu"))
flat = torch.randn(mb * 1_000_000)
exchange.mean(flat)
dist.barrier()
start = time.perf_counter()
for _ in range(iters):
    exchange.mean(flat)
took = (time.perf_counter() - start) / iters
if rank == 0:
    print(json.dumps({"streams": streams, "seconds": took, "sent_bytes": exchange.sent_bytes}))
dist.destroy_process_group()
"""


def exchange_seconds(streams: int, mb: int, iters: int) -> dict:
    """The four ranks in the cluster's namespaces; rank 0's timing."""
    ips = [f"10.86.0.{10 + i}" for i in range(4)]
    procs = []
    for rank in range(4):
        env = {**os.environ, "MASTER_ADDR": ips[0], "MASTER_PORT": str(PORT + streams), "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": "eth0", "FATPIPE_REGION": f"r{rank // 2}"}
        procs.append(subprocess.Popen(["ip", "netns", "exec", f"fp-{CLUSTER}-{rank}", sys.executable, "-c", _RANK,
                                       str(rank), "4", str(streams), str(mb), str(iters)],
                                      env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"an exchange with {streams} stream(s) failed")
    return json.loads(outs[0].strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=8, help="millions of float32 values exchanged")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("terraform"):
        print("needs root (network namespaces, tc) and terraform on PATH")
        return 0
    from fatpipe.infra.project import load_project
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster

    root = Path(tempfile.mkdtemp(prefix="fatpipe-streams-"))
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = 4\ntier = "10g"\nisolation = "netns"\n'
        f'private_cidr = "{CIDR}"\nregions = 2\ncross_region_gbps = {CROSS}\ncross_region_flow_gbps = {FLOW}\n')
    project = load_project(root / "fatpipe.toml")
    try:
        deploy_cluster(project, project.cluster(CLUSTER))
        one = exchange_seconds(1, args.mb, args.iters)
        many = exchange_seconds(args.streams, args.mb, args.iters)
    finally:
        destroy_cluster(project, project.cluster(CLUSTER))
        shutil.rmtree(root, ignore_errors=True)
    ratio = one["seconds"] / many["seconds"]
    print(f"exchange of {args.mb}M values between 2 regions (link {CROSS} Gbit/s, {FLOW} per flow): "
          f"1 stream per shard {one['seconds']:.2f} s, {args.streams} streams {many['seconds']:.2f} s: "
          f"{ratio:.2f}x faster")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regions_streams.json").write_text(json.dumps(
        {"bench": "regions_streams", "cross_gbps": CROSS, "flow_gbps": FLOW, "mb": args.mb,
         "one": one, "many": many, "ratio": ratio}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
