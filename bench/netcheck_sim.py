"""netcheck on a 4-node sim cluster at 1 Gbit/s: busbw per size, p2p per pair, and a node cut to 1/4.

Deploys a throw-away sim cluster (netns isolation, needs root and terraform) in a temporary
project folder, runs the full netcheck `--repeat` times, then shapes one node's link to a quarter
of the tier and runs a quick netcheck, which must fail naming that node. Prints busbw against
the tier and against what TCP can carry over a 1500-byte MTU (1448/1514 of the wire rate),
with the load average, since the sim's links share this machine's CPUs with everything else.

    sudo .venv/bin/python bench/netcheck_sim.py [--repeat 3] [--nodes 4] [--out bench/out]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

CLUSTER = "b-net"
CIDR = "10.61.3.0/24"
TCP_MTU1500_CEILING = 1448 / 1514  # payload per frame with TCP timestamps, of the bytes tbf counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--slow-fraction", type=float, default=0.25)
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("terraform"):
        print("needs root (network namespaces, tc) and terraform on PATH")
        return 0

    from rich.console import Console

    from fatpipe.infra.project import load_project
    from fatpipe.ops.net.netcheck import NetcheckFailed, NetcheckOptions, run_netcheck
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster
    from fatpipe.stacks.simnet import reshape_node

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="fatpipe-netcheck-bench-"))
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = {args.nodes}\ntier = "1g"\n'
        f'isolation = "netns"\nprivate_cidr = "{CIDR}"\n')
    project = load_project(root / "fatpipe.toml")
    console = Console()
    runs, slow = [], {}
    try:
        outputs = deploy_cluster(project, CLUSTER)
        for i in range(args.repeat):
            load = os.getloadavg()[0]
            started = time.monotonic()
            doc = run_netcheck(project, outputs, options=NetcheckOptions(enforce=False),
                               console=console if i == args.repeat - 1 else None)
            runs.append({"load_before": load, "elapsed_s": time.monotonic() - started, "doc": doc})
            shutil.copy(next(root.glob(f".fatpipe/{CLUSTER}/runs/*/netcheck.png")), out_dir / "netcheck_sim.png")
        slow_node = f"{CLUSTER}-{args.nodes // 2}"
        reshape_node(CLUSTER, args.nodes // 2, args.slow_fraction * outputs.tier_gbps)
        started = time.monotonic()
        try:
            run_netcheck(project, outputs, options=NetcheckOptions(quick=True))
            slow = {"node": slow_node, "named": False, "reasons": []}
        except NetcheckFailed as e:
            slow = {"node": slow_node, "named": f"node {slow_node}:" in str(e),
                    "reasons": e.doc["gate"]["reasons"], "elapsed_s": time.monotonic() - started,
                    "p2p": {p["client"]: p["best_gbps"] for p in e.doc["p2p"]["pairs"]}}
    finally:
        destroy_cluster(project, CLUSTER)
        shutil.rmtree(root, ignore_errors=True)

    report = summarize(runs, slow, outputs.tier_gbps)
    path = out_dir / "netcheck_sim.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path} and {out_dir / 'netcheck_sim.png'}")
    return 0 if slow.get("named") else 1


def summarize(runs: list[dict], slow: dict, tier: float) -> dict:
    import torch

    sizes = [r["size"] for r in runs[0]["doc"]["allreduce"]]
    per_size = {}
    print(f"{'size':>10} {'busbw Gbit/s (mean, min-max)':>30} {'/tier':>7} {'/TCP ceiling':>13}")
    for i, size in enumerate(sizes):
        values = [run["doc"]["allreduce"][i]["busbw_gbps"] for run in runs]
        mean = statistics.fmean(values)
        per_size[size] = {"mean": mean, "min": min(values), "max": max(values)}
        print(f"{size >> 20:>8} M {mean:>14.3f} ({min(values):.3f}-{max(values):.3f}) "
              f"{mean / tier:>7.3f} {mean / (tier * TCP_MTU1500_CEILING):>13.3f}")
    pairs: dict[str, list[float]] = {}
    for run in runs:
        for pair in run["doc"]["p2p"]["pairs"]:
            pairs.setdefault(pair["client"], []).append(pair["best_gbps"])
    for node, values in pairs.items():
        print(f"p2p {node}: {statistics.fmean(values):.3f} Gbit/s (min {min(values):.3f}) = "
              f"{statistics.fmean(values) / tier:.3f} x tier")
    print(f"latency: {[round(run['doc']['latency_s'] * 1e6) for run in runs]} us; "
          f"elapsed {[round(run['elapsed_s']) for run in runs]} s; "
          f"load average before {[round(run['load_before'], 1) for run in runs]}")
    print(f"slow node {slow.get('node')} at 1/4: named={slow.get('named')}: {slow.get('reasons')}")
    return {
        "bench": "netcheck_sim",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                 "torch": torch.__version__},
        "tier_gbps": tier,
        "tcp_ceiling_gbps": tier * TCP_MTU1500_CEILING,
        "busbw_gbps_by_size": per_size,
        "p2p_gbps_by_node": pairs,
        "runs": [{k: v for k, v in run.items() if k != "doc"} | {"busbw_gbps": run["doc"]["busbw_gbps"],
                                                               "latency_s": run["doc"]["latency_s"]}
                 for run in runs],
        "slow_node": slow,
    }


if __name__ == "__main__":
    sys.exit(main())
