"""What `live` costs when nothing fails: fault-free live against restart on one cluster, interleaved.

The cluster and the regime are bench/faults.py's: 4 netns sim nodes, links time-scaled to what an
RTX 4090 node on 1 Gbit/s sees, each node's processes held to its share of this machine's CPUs (a
cpu cgroup per node). On that one cluster, --pairs pairs of fault-free runs of the same steps, the
order alternating (live first, then restart first), so drift in the machine's load falls on both
modes alike. Per run: tokens/s over the steps' own time (node 0's `step_s`, the start and the end
left out) and the seconds from the command to the first recorded step. Printed: every pair, the
median of the paired ratios live/restart with a 90% bootstrap interval (resampling the pairs),
and the same for the first step's time; the goals (issue 45): live at most 2% fewer tokens/s, and
its first step no later than restart's.

    sudo .venv/bin/python bench/live_cost.py [--pairs 7] [--steps 60]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import CGROUP, CIDR, CLUSTER, NODES, NodeQuotas, run_one  # noqa: E402
from seed_table import GLOBAL_BATCH_TOKENS, TARGETS, calibrate, host  # noqa: E402

NODE_TOKENS = 8 * 64  # batch x seq_len per node and step


def bootstrap(values: list[float], rounds: int = 4000, seed: int = 1) -> tuple[float, float]:
    """A 90% interval of the median of `values`, resampled with replacement."""
    draw = random.Random(seed)
    medians = sorted(statistics.median(draw.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(0.05 * rounds)], medians[int(0.95 * rounds) - 1]


def rate(run: dict) -> float:
    """Tokens per second of the steps' own time on node 0 (every node's batch in every step)."""
    steps = {r["step"]: r["step_s"] for r in run["records"]}
    return len(steps) * NODES * NODE_TOKENS / sum(steps.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("terraform") or not CGROUP.is_dir():
        print("needs root (network namespaces, tc, the cgroup cpu controller) and terraform")
        return 0
    from fatpipe.infra.project import load_project
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster
    from fatpipe.trainer.model import GPT, preset_config

    root = Path(tempfile.mkdtemp(prefix="fatpipe-live-cost-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` tears down
    train = ["--preset", "tiny", "--batch-size", "8", "--seq-len", "64", "--warmup-steps", "20",
             "--comm", "none", "--seed", "1337", "--eval-windows", "8", "--steps", str(args.steps)]
    compute_s = calibrate(root, [*train[:-2], "--steps", "30"])
    elements = {p: sum(math.prod(t.shape) for t in GPT(preset_config(p, 64)).parameters()) for p in ("tiny", "124m")}
    target_s = GLOBAL_BATCH_TOKENS / NODES / TARGETS["rtx4090"]["tokens_per_s"]
    link = elements["tiny"] / elements["124m"] * (target_s / compute_s)
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = {NODES}\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "{CIDR}"\nrdzv_port = 29684\nlink_gbps = {link:.6f}\n')
    project = load_project(root / "fatpipe.toml")
    timing = argparse.Namespace(duration=args.steps * 10.0)  # run_one's bound: generous
    pairs, quotas = [], NodeQuotas()
    try:
        deploy_cluster(project, project.cluster(CLUSTER))
        for k in range(args.pairs):
            order = ("live", "restart") if k % 2 == 0 else ("restart", "live")
            runs = {mode: run_one(root, f"{mode}-{k}", [*train, "--fault-tolerance", mode], [], timing)
                    for mode in order}
            pair = {mode: {"tokens_per_s": rate(run), "first_step_s": run["startup_s"], "exit": run["exit"],
                           "load": os.getloadavg()[0]} for mode, run in runs.items()}
            pairs.append(pair)
            print(f"pair {k + 1} ({order[0]} first): live {pair['live']['tokens_per_s']:,.0f} tok/s, first step "
                  f"{pair['live']['first_step_s']:.1f} s; restart {pair['restart']['tokens_per_s']:,.0f} tok/s, "
                  f"first step {pair['restart']['first_step_s']:.1f} s", flush=True)
    finally:
        quotas.stop()
        destroy_cluster(project, project.cluster(CLUSTER))
        shutil.rmtree(root, ignore_errors=True)
    doc = {"bench": "live_cost", "host": host(), "link_gbps": link, "compute_s": compute_s, "args": vars(args),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "pairs": pairs,
           **judge(pairs)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "live_cost.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / 'live_cost.json'}")
    return 0


def judge(pairs: list[dict]) -> dict:
    """The medians of the paired ratios and differences, their intervals, and the goals."""
    ratios = [p["live"]["tokens_per_s"] / p["restart"]["tokens_per_s"] for p in pairs]
    later = [p["live"]["first_step_s"] - p["restart"]["first_step_s"] for p in pairs]
    ratio, (low, high) = statistics.median(ratios), bootstrap(ratios)
    delay, (d_low, d_high) = statistics.median(later), bootstrap(later)
    print(f"live / restart tokens/s: median {ratio:.3f} (90% interval {low:.3f}-{high:.3f}) over "
          f"{len(pairs)} pairs: {', '.join(f'{r:.3f}' for r in ratios)} "
          f"(goal >= 0.98: {'met' if ratio >= 0.98 else 'missed'})")
    print(f"live's first step - restart's: median {delay:+.1f} s (90% interval {d_low:+.1f} to {d_high:+.1f}): "
          f"{', '.join(f'{d:+.1f}' for d in later)} (goal <= 0: {'met' if delay <= 0 else 'missed'})")
    return {"ratio": {"median": ratio, "interval_90": [low, high], "each": ratios},
            "first_step_later_s": {"median": delay, "interval_90": [d_low, d_high], "each": later}}


if __name__ == "__main__":
    sys.exit(main())
