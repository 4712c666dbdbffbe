"""What per-node metrics cost: the same short run on a 4-node sim with them on and off, side by side.

Deploys a throw-away sim cluster (netns isolation, 1g tier; needs root and terraform) in a
temporary project folder and trains the tiny preset with `fatpipe launch`, alternating
`--node-metrics-every N` and `--node-metrics-every 0` for `--pairs` pairs, so load drifts hit
both alike. Prints each run's step time p50 (summary.json), the median of each side and their
ratio (target: under 2% overhead), and writes bench/out/node_metrics.json.

    sudo .venv/bin/python bench/node_metrics.py [--pairs 3] [--steps 80] [--every 10]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CLUSTER = "tp-bench"
CIDR = "10.144.0.0/24"


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "NO_COLOR": "1"}
    env.pop("FATPIPE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def one_run(folder: Path, steps: int, every: int) -> dict:
    train = ["--preset", "tiny", "--steps", str(steps), "--batch-size", "4", "--seq-len", "64",
             "--comm", "none", "--warmup-steps", "3", "--checkpoint-every", str(steps * 10),
             "--node-metrics-every", str(every), "--max-restarts", "0"]
    load = os.getloadavg()[0]
    done = fatpipe(folder, "launch", CLUSTER, *train)
    if done.returncode != 0:
        raise RuntimeError(f"launch failed:\n{done.stdout[-3000:]}")
    run = json.loads(fatpipe(folder, "status", CLUSTER, "--json").stdout)["run"]
    summary = run["summary"]
    path = Path(run["dir"], "nodes.jsonl")
    views = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {"every": every, "run": run["id"], "step_s_p50": summary["step_s_p50"],
            "sync_s_p50": summary["sync_s_p50"], "load_before": load, "windows": len(views),
            **in_process_share(views)}


def in_process_share(views: list[dict]) -> dict:
    """The time every rank spent in node metrics against its step time, from its own windows.

    Each window's cost_s covers the summary before it (taking the counters, the store, rank 0's
    files); the last window's includes rank 0's wait for the others' last summary, which ends
    the run rather than slowing a step, so it is left out.
    """
    cost: dict[str, float] = {}
    steps: dict[str, float] = {}
    for view in views[:-1]:
        for n in view["nodes"]:
            cost[n["node"]] = cost.get(n["node"], 0.0) + n.get("cost_s", 0.0)
            steps[n["node"]] = steps.get(n["node"], 0.0) + n.get("time_s", 0.0)
    if not steps:
        return {}
    shares = {name: cost[name] / steps[name] for name in steps if steps[name]}
    return {"cost_share": sum(cost.values()) / sum(steps.values()), "cost_share_max": max(shares.values()),
            "cost_s_per_window": sum(cost.values()) / len(cost) / max(1, len(views) - 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--every", type=int, default=10, help="node_metrics_every of the 'on' runs")
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("terraform"):
        print("needs root (network namespaces, tc) and terraform on PATH")
        return 0
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="fatpipe-node-metrics-bench-"))
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = 4\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "{CIDR}"\nrdzv_port = 29644\n')
    runs = []
    try:
        done = fatpipe(root, "deploy", CLUSTER, "--yes")
        if done.returncode != 0:
            print(done.stdout[-3000:])
            return 1
        for i in range(args.pairs):
            # Alternate which side goes first, so a trend in the machine's load favours neither.
            for every in ((args.every, 0) if i % 2 == 0 else (0, args.every)):
                runs.append(one_run(root, args.steps, every))
                r = runs[-1]
                print(f"node_metrics_every {every:>3}: step p50 {r['step_s_p50'] * 1e3:7.2f} ms, "
                      f"sync p50 {r['sync_s_p50'] * 1e3:6.2f} ms, {r['windows']} windows, "
                      f"load {r['load_before']:.1f}" + (f", in-process {r['cost_share'] * 100:.3f}% of step "
                      f"time" if "cost_share" in r else ""), flush=True)
    finally:
        fatpipe(root, "down", CLUSTER)
        shutil.rmtree(root, ignore_errors=True)

    on = statistics.median(r["step_s_p50"] for r in runs if r["every"])
    off = statistics.median(r["step_s_p50"] for r in runs if not r["every"])
    ratio = on / off
    # Each pair ran back to back, under about the same load: its own ratio is the fairer figure.
    pair_ratios = [(a if a["every"] else b)["step_s_p50"] / (b if a["every"] else a)["step_s_p50"]
                   for a, b in zip(runs[::2], runs[1::2], strict=True)]
    pair_ratio = statistics.median(pair_ratios)
    print(f"step p50 with node metrics {on * 1e3:.2f} ms, without {off * 1e3:.2f} ms: "
          f"ratio {ratio:.4f} ({(ratio - 1) * 100:+.2f}%; target < +2%); per pair "
          f"{', '.join(f'{r:.3f}' for r in pair_ratios)}, median {pair_ratio:.4f}")
    shares = [r["cost_share"] for r in runs if "cost_share" in r]
    share = statistics.median(shares) if shares else None
    if share is not None:
        print(f"measured in the same runs: node metrics took {share * 100:.3f}% of step time "
              f"(worst node of any run {max(r['cost_share_max'] for r in runs if 'cost_share' in r) * 100:.3f}%); "
              f"the side-by-side ratio above carries the machine's load noise")
    import torch

    report = {
        "bench": "node_metrics",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                 "torch": torch.__version__},
        "steps": args.steps, "every": args.every, "nodes": 4, "tier": "1g",
        "step_s_p50_on": on, "step_s_p50_off": off, "ratio": ratio, "pair_ratios": pair_ratios,
        "in_process_share": share, "runs": runs,
    }
    path = out_dir / "node_metrics.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
