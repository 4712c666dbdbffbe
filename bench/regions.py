"""Two regions, time-scaled: flat DDP against DDP inside each region and DiLoCo between them.

One 4-node sim cluster in 2 regions of 2 nodes: the links inside each region at 10 Gbit/s and
the one link between them at 1 Gbit/s, then at 200 Mbit/s, every rate time-scaled to the RTX
4090 regime as bench/seed_table.py scales its links (the sim's compute measured here first; the
target's from a published throughput). Rows, each with the same model, data order, steps and
tokens:

    all 10g  flat none   the reference: one region's speed everywhere
    <x>      flat none   one ring over every node at every step
    <x>      flat auto   comm=auto on the flat ring (a hook per step)
    <x>      hier auto   comm=auto per level: a hook inside each region, DiLoCo between them
                         every H steps (auto's H) on int8 pseudo-gradients with error feedback

Per row: compute utilization (the measured compute per step over the measured wall time per step,
rank 0), the bytes that crossed between regions per step (the shaped link's own counters), the
eval loss, and the step `fatpipe plan --span regions` predicts for it (`ops.plan.regionplan`)
against the measured one. Goals (printed as met or missed): hierarchical utilization >= 0.95
at 1g and >= 0.90 at 200 Mbit/s; >= 100x fewer bytes crossing per step than flat DDP; eval loss
within 2% of the all-10g reference; the predicted step within 15% of each measured one.

    sudo .venv/bin/python bench/regions.py [--steps 1000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_table import GLOBAL_BATCH_TOKENS, TARGETS, calibrate, fatpipe, host, warmup_steps  # noqa: E402

CLUSTER, CIDR, NODES, REGIONS = "rg-bench", "10.85.0.0/24", 4, 2
CROSS = {"1g": 1.0, "200m": 0.2}
GOALS = {"util_1g": 0.95, "util_200m": 0.90, "fewer_bytes": 100, "eval_within": 0.02, "plan_within": 0.15}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1000, help="enough for 20 syncs at auto's H (>= 50)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--scale", type=float, help="the link scale of an earlier run, instead of measuring one")
    p.add_argument("--only", nargs="+", metavar="LABEL", help="run these rows only (e.g. \"200m hier auto\")")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("terraform"):
        print("needs root (network namespaces, tc) and terraform on PATH")
        return 0
    from fatpipe.infra.project import load_project
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster
    from fatpipe.trainer.model import GPT, preset_config

    elements = {preset: sum(math.prod(t.shape) for t in GPT(preset_config(preset, args.seq_len)).parameters())
                for preset in ("tiny", "124m")}
    root = Path(tempfile.mkdtemp(prefix="fatpipe-regions-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    train = ["--preset", "tiny", "--steps", str(args.steps), "--batch-size", str(args.batch_size),
             "--seq-len", str(args.seq_len), "--warmup-steps", str(warmup_steps(args.steps)),
             "--checkpoint-every", str(args.steps), "--seed", "1337", "--no-redecide",
             "--fault-tolerance", "restart"]
    target = TARGETS["rtx4090"]
    target_s = GLOBAL_BATCH_TOKENS / NODES / target["tokens_per_s"]
    compute_s = calibrate(root, train)
    scale = args.scale or (elements["tiny"] / elements["124m"]) * (target_s / compute_s)
    intra = 10 * scale
    print(f"scale: {target['name']}, {target_s * 1e3:.0f} ms compute/step; sim compute "
          f"{compute_s * 1e3:.1f} ms/step -> links x{scale:.5f}: 10g = {intra * 1e3:.1f} Mbit/s, "
          + ", ".join(f"{k} = {v * scale * 1e3:.2f} Mbit/s" for k, v in CROSS.items()))
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = {NODES}\ntier = "10g"\nisolation = "netns"\n'
        f'private_cidr = "{CIDR}"\nrdzv_port = 29586\nlink_gbps = {intra:.6f}\nregions = {REGIONS}\n'
        f'cross_region_gbps = {intra:.6f}\n')
    project = load_project(root / "fatpipe.toml")
    rows: list[dict] = []
    try:
        deploy_cluster(project, project.cluster(CLUSTER))
        plan = [("all 10g flat none", intra, ["--comm", "none", "--cross-comm", "flat"])]
        for name, gbps in CROSS.items():
            plan += [(f"{name} flat none", gbps * scale, ["--comm", "none", "--cross-comm", "flat"]),
                     (f"{name} flat auto", gbps * scale, ["--comm", "auto", "--cross-comm", "flat"]),
                     (f"{name} hier auto", gbps * scale, ["--comm", "auto", "--auto-periodic", "--cross-comm", "auto"])]
        for label, rate, extra in plan:
            if not args.only or label in args.only:
                rows.append(run_row(root, label, rate, train + extra, compute_s, intra))
    finally:
        destroy_cluster(project, project.cluster(CLUSTER))
        shutil.rmtree(root, ignore_errors=True)
    verdicts = judge(rows) if not args.only else []
    doc = {"bench": "regions", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": host(), "scale": scale, "sim_compute_s": compute_s, "target": target, "steps": args.steps,
           "goals": GOALS, "rows": rows, "verdicts": verdicts}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "regions.json" if not args.only else "regions_only.json"
    (out / name).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / name}")
    return 0


def run_row(root: Path, label: str, cross_gbps: float, train: list[str], compute_s: float,
            intra_gbps: float) -> dict:
    """One launch with the link between regions at `cross_gbps`; what crossed, by the counters."""
    from fatpipe.ops.plan.plan import model_traffic
    from fatpipe.ops.plan.regionplan import predict_measured
    from fatpipe.stacks.sim.net import cluster_digest
    from fatpipe.stacks.sim.regions import crossed_bytes, reshape_cross_region

    digest = cluster_digest(CLUSTER)
    reshape_cross_region(digest, REGIONS, cross_gbps)
    before = sum(c["out"] for c in crossed_bytes(digest, REGIONS).values())
    done = fatpipe(root, "launch", CLUSTER, *train, "--max-restarts", "0", "--timeout", "3000", timeout=4000)
    if done.returncode:
        raise SystemExit(f"{label}: launch failed:\n{done.stdout[-4000:]}")
    crossed = sum(c["out"] for c in crossed_bytes(digest, REGIONS).values()) - before
    runs = root / ".fatpipe" / CLUSTER / "runs"
    run_dir = runs / (runs / "latest").read_text().strip()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = len(records)
    wall = sum(r["step_s"] for r in records[1:]) / max(1, steps - 1)  # the first step warms up
    regions = summary.get("regions") or {}
    predicted = predict_measured(summary, model_traffic(summary["preset"]), compute_s, cross_gbps,
                                 intra_gbps, steps)
    row = {"label": label, "cross_gbps": cross_gbps, "comm": summary["comm"],
           "outer": regions.get("outer"), "step_s": wall, "compute_s": compute_s,
           "utilization": compute_s / wall, "crossed_per_step": crossed / steps,
           "eval_loss": summary["eval_loss"], "final_loss": summary["final_loss"],
           "predicted_step_s": predicted, "replicas_in_sync": summary.get("replicas_in_sync")}
    outer = f", diloco every {row['outer']['sync_every']}" if row["outer"] else ""
    print(f"{label}: comm {row['comm']}{outer}; step {wall * 1e3:.0f} ms (plan {predicted * 1e3:.0f}), "
          f"utilization {row['utilization']:.3f}, {row['crossed_per_step'] / 1e3:.1f} KB crossed/step, "
          f"eval loss {row['eval_loss']:.4f}")
    return row


def judge(rows: list[dict]) -> list[str]:
    """Each goal, met or missed, with the figures."""
    by = {r["label"]: r for r in rows}
    ref = by["all 10g flat none"]
    lines = []
    for name in CROSS:
        hier, flat = by[f"{name} hier auto"], by[f"{name} flat none"]
        goal = GOALS[f"util_{name}"]
        lines.append(f"{name}: hierarchical utilization {hier['utilization']:.3f} "
                     f"({'met' if hier['utilization'] >= goal else 'missed'}, goal {goal})")
        fewer = flat["crossed_per_step"] / max(hier["crossed_per_step"], 1)
        lines.append(f"{name}: {fewer:.0f}x fewer bytes crossing per step than flat DDP "
                     f"({'met' if fewer >= GOALS['fewer_bytes'] else 'missed'}, goal {GOALS['fewer_bytes']}x)")
        off = hier["eval_loss"] / ref["eval_loss"] - 1
        lines.append(f"{name}: eval loss {hier['eval_loss']:.4f} vs reference {ref['eval_loss']:.4f} "
                     f"({off:+.1%}; {'met' if abs(off) <= GOALS['eval_within'] else 'missed'}, goal 2%)")
    for row in rows:
        off = row["predicted_step_s"] / row["step_s"] - 1
        lines.append(f"{row['label']}: plan's step {row['predicted_step_s'] * 1e3:.0f} ms vs measured "
                     f"{row['step_s'] * 1e3:.0f} ms "
                     f"({off:+.0%}; {'met' if abs(off) <= GOALS['plan_within'] else 'missed'})")
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    sys.exit(main())
