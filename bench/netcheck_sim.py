"""netcheck on a 4-node sim cluster at 1 Gbit/s: the full sweep against --quick, and a node cut to 1/4.

Deploys a throw-away sim cluster (netns isolation, needs root and terraform) in a temporary
project folder, runs the full netcheck and `netcheck --quick` `--repeat` times, alternating
which goes first, each a new measurement (no result reused), then shapes one node's link to a
quarter of the tier and runs a quick netcheck, which must fail naming that node. Prints busbw
per size against the tier and against what TCP can carry over a 1500-byte MTU (1448/1514 of the
wire rate), then the goal (issues 35 and 45): quick's busbw within 5% of the sweep's, in at most a
third of its time, as medians with each run beside them, quick's busbw (its ring of plain sockets)
against gloo's at the same size in the sweep, and the load average, since the sim's links share
this machine's CPUs with everything else.

    sudo .venv/bin/python bench/netcheck_sim.py [--repeat 3] [--quick] [--nodes 4] [--out bench/out]
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
    p.add_argument("--repeat", type=int, default=3, help="pairs of full and quick runs, alternating")
    p.add_argument("--quick", action="store_true", help="one pair of runs (under 5 minutes)")
    p.add_argument("--cluster", default=CLUSTER)
    p.add_argument("--cidr", default=CIDR)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--slow-fraction", type=float, default=0.25)
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    if args.quick:
        args.repeat = 1
    if os.geteuid() != 0 or not shutil.which("terraform"):
        print("needs root (network namespaces, tc) and terraform on PATH")
        return 0

    from fatpipe.infra.project import load_project
    from fatpipe.ops.net.check import NetcheckFailed, NetcheckOptions, run_netcheck
    from fatpipe.ops.reach.cluster import Cluster
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster
    from fatpipe.stacks.sim.net import reshape_node

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="fatpipe-netcheck-bench-"))
    (root / "fatpipe.toml").write_text(
        f'[clusters.{args.cluster}]\nprovider = "sim"\nnodes = {args.nodes}\ntier = "1g"\n'
        f'isolation = "netns"\nprivate_cidr = "{args.cidr}"\n')
    project = load_project(root / "fatpipe.toml")
    cluster = args.cluster
    runs, quick_runs, slow = [], [], {}

    def measure(quick: bool) -> None:
        load = os.getloadavg()[0]
        started = time.monotonic()
        doc = run_netcheck(Cluster.resolve(project, cluster, outputs),
                           options=NetcheckOptions(enforce=False, quick=quick))
        (quick_runs if quick else runs).append(
            {"load_before": load, "elapsed_s": time.monotonic() - started, "doc": doc})
        print(f"{'quick' if quick else 'full '} netcheck: {time.monotonic() - started:5.1f} s, "
              f"busbw {doc['busbw_gbps']:.3f} Gbit/s at {doc['busbw_size'] >> 20} MiB", flush=True)

    try:
        outputs = deploy_cluster(project, project.cluster(cluster))
        for i in range(args.repeat):
            for quick in ((False, True) if i % 2 == 0 else (True, False)):
                measure(quick)
        shutil.copy(next(root.glob(f".fatpipe/{cluster}/runs/*/netcheck.png")), out_dir / "netcheck_sim.png")
        slow_node = f"{cluster}-{args.nodes // 2}"
        reshape_node(cluster, args.nodes // 2, args.slow_fraction * outputs.tier_gbps)
        started = time.monotonic()
        try:
            run_netcheck(Cluster.resolve(project, cluster, outputs), options=NetcheckOptions(quick=True))
            slow = {"node": slow_node, "named": False, "reasons": []}
        except NetcheckFailed as e:
            slow = {"node": slow_node, "named": f"node {slow_node}:" in str(e),
                    "reasons": e.doc["gate"]["reasons"], "elapsed_s": time.monotonic() - started,
                    "p2p": {p["client"]: p["best_gbps"] for p in e.doc["p2p"]["pairs"]}}
    finally:
        destroy_cluster(project, project.cluster(cluster))
        shutil.rmtree(root, ignore_errors=True)

    report = summarize(runs, slow, outputs.tier_gbps) | {"quick_vs_full": compare(runs, quick_runs)}
    path = out_dir / "netcheck_sim.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path} and {out_dir / 'netcheck_sim.png'}")
    return 0 if slow.get("named") else 1


def compare(full: list[dict], quick: list[dict]) -> dict:
    """The goal's figures: medians of each kind's busbw and time, and their ratios."""
    med = {name: {"elapsed_s": statistics.median(r["elapsed_s"] for r in runs),
                  "busbw_gbps": statistics.median(r["doc"]["busbw_gbps"] for r in runs)}
           for name, runs in (("full", full), ("quick", quick))}
    busbw_ratio = med["quick"]["busbw_gbps"] / med["full"]["busbw_gbps"]
    time_ratio = med["quick"]["elapsed_s"] / med["full"]["elapsed_s"]
    print(f"\n{'netcheck':>9} {'median s':>9} {'median busbw Gbit/s':>20}  runs (s / Gbit/s)")
    for name, runs in (("full", full), ("quick", quick)):
        each = ", ".join(f"{r['elapsed_s']:.1f}/{r['doc']['busbw_gbps']:.3f}" for r in runs)
        print(f"{name:>9} {med[name]['elapsed_s']:>9.1f} {med[name]['busbw_gbps']:>20.3f}  {each}")
    busbw_met, time_met = abs(busbw_ratio - 1) <= 0.05, time_ratio <= 1 / 3
    print(f"quick/full busbw {busbw_ratio:.3f} (goal within 0.95-1.05: {'met' if busbw_met else 'missed'}); "
          f"quick/full time {time_ratio:.3f} (goal <= 0.333: {'met' if time_met else 'missed'})")
    # The quick check's backend (a ring of plain sockets, no torch) against gloo's at the same size.
    size = quick[0]["doc"]["busbw_size"]
    same = statistics.median(row["busbw_gbps"] for r in full for row in r["doc"]["allreduce"] if row["size"] == size)
    print(f"at {size >> 20} MiB: quick ({quick[0]['doc']['backend']}) {med['quick']['busbw_gbps']:.3f} against "
          f"the sweep ({full[0]['doc']['backend']}) {same:.3f} Gbit/s: {med['quick']['busbw_gbps'] / same:.3f}")
    return {"median": med, "busbw_ratio": busbw_ratio, "time_ratio": time_ratio,
            "same_size": {"size": size, "full_busbw_gbps": same, "ratio": med["quick"]["busbw_gbps"] / same},
            "busbw_goal_met": busbw_met, "time_goal_met": time_met,
            "full_s": [r["elapsed_s"] for r in full], "quick_s": [r["elapsed_s"] for r in quick],
            "full_busbw": [r["doc"]["busbw_gbps"] for r in full],
            "quick_busbw": [r["doc"]["busbw_gbps"] for r in quick]}


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
