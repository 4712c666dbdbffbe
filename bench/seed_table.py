"""The seed's table rerun, time-scaled: one 4-node sim cluster, five comm configurations.

The seed (8 VPS nodes) says faster links cut epoch time by ~35%. On this CPU a step's compute
is so slow that no link matters, so the rehearsal scales the links instead: each rate is chosen
so that gradient bytes / bandwidth over compute time is what a named GPU node would see,

    sim rate = tier rate x (sim gradient bytes / target gradient bytes)
                         x (target compute per step / sim compute per step)

with the sim's compute measured here first (4 ranks, nothing sent) and the target's from a
published throughput (TARGETS below; --target picks one, --target-* override it). The same
model, data order and steps then run as 10g none, 1g none, 1g auto (with `auto_periodic`, so
it may take DiLoCo or local SGD, at 50 steps or more: 100 steps hold two such intervals), 1g
powersgd and 1g <the periodic method auto prefers, at the interval it computed>. Each row's eval
loss is its summary's: the final model on the held-out windows, never trained on. Prints the table and the ratios,
writes bench/results/seed_table.json and seed_table.png. Needs root (network namespaces, tc)
and terraform; the cluster is deployed from a temporary folder and destroyed at the end.

    sudo .venv/bin/python bench/seed_table.py [--steps 100] [--target rtx4090|h100]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_table_report import plot, report  # noqa: E402

CLUSTER, CIDR, NODES = "sd-table", "10.84.0.0/24", 4
# The target: GPT-2 124M (this project's `124m` preset) trained as llm.c trains it, 524,288
# tokens per step (GPT-3's batch for its 125M model), here shared by the 4 nodes, so each node
# computes 131,072 tokens per step (with gradient accumulation where memory asks for it), and
# warms the LR up for 700 of its 19,073 steps. Per-node compute time is a named GPU's published
# throughput for that model. The default is the GPU of the machines fatpipe is for: rented
# nodes whose private link is 1 or 10 Gbit/s carry consumer or mid-range cards; an H100 node
# comes with a 100-3,200 Gbit/s fabric of its own (kept as a second target for comparison).
GLOBAL_BATCH_TOKENS, LLMC_WARMUP_SHARE = 524_288, 700 / 19_073
TARGETS = {
    "rtx4090": {
        "name": "1x RTX 4090 per node, GPT-2 124M (preset 124m), bf16",
        "tokens_per_s": 220.7e3 / 2,
        "source": "llm.c's PyTorch GPT-2 trainer on 2x RTX 4090: 220.7k tokens/s (T. Romero, "
                  "'NanoGPT Speedrun Living Worklog', record 1, initial baseline, 2025-01-16)",
    },
    "h100": {
        "name": "1x H100 SXM per node, GPT-2 124M (preset 124m), bf16",
        "tokens_per_s": 10e9 / (45 * 60) / 8,
        "source": "llm.c GPT-2 124M on 8x H100: 10B tokens in 45 min at 524,288 tokens/step "
                  "(modded-nanogpt record table, record 1; llm.c discussion #481)",
    },
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--target", choices=sorted(TARGETS), default="rtx4090")
    p.add_argument("--target-tokens-per-s", type=float, help="override the target's throughput")
    p.add_argument("--target-tokens-per-step", type=int, default=GLOBAL_BATCH_TOKENS // NODES)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("terraform"):
        print("needs root (network namespaces, tc) and terraform on PATH")
        return 0
    from fatpipe.infra.project import load_project
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster
    from fatpipe.stacks.sim.net import reshape_node
    from fatpipe.trainer.bandwidth import bus_factor
    from fatpipe.trainer.comm.costmodel import powersgd_wire_elements
    from fatpipe.trainer.model import GPT, preset_config

    shapes = {preset: [t.shape for t in GPT(preset_config(preset, args.seq_len)).parameters()]
              for preset in ("tiny", "124m")}
    elements = {preset: sum(math.prod(shape) for shape in s) for preset, s in shapes.items()}
    # PowerSGD's (rank 4) share of the plain gradient: the tiny model's small matrices compress
    # far less than the target's, which the link scale cannot carry over.
    powersgd_share = {preset: powersgd_wire_elements(s, 4) / elements[preset]
                      for preset, s in shapes.items()}

    root = Path(tempfile.mkdtemp(prefix="fatpipe-seed-table-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` tears the cluster down
    train = ["--preset", "tiny", "--steps", str(args.steps), "--batch-size", str(args.batch_size),
             "--seq-len", str(args.seq_len), "--warmup-steps", str(warmup_steps(args.steps)),
             "--checkpoint-every", str(args.steps), "--seed", "1337"]
    compute_s = calibrate(root, train)
    target = {**TARGETS[args.target], "key": args.target}
    if args.target_tokens_per_s:
        target.update(tokens_per_s=args.target_tokens_per_s, source="--target-tokens-per-s")
    target_s = args.target_tokens_per_step / target["tokens_per_s"]
    g_sim, g_target = elements["tiny"] * 4, elements["124m"] * 4  # fp32 gradients
    scale = (g_sim / g_target) * (target_s / compute_s)
    rates = {"10g": 10 * scale, "1g": 1 * scale}

    def comm_over_compute(tokens_per_s: float) -> dict:
        """A ring all-reduce of the target's gradient over its compute, at 1 and 10 Gbit/s."""
        compute = args.target_tokens_per_step / tokens_per_s
        return {t: g_target * bus_factor(NODES) * 8 / (r * 1e9) / compute
                for t, r in (("1g", 1), ("10g", 10))}
    assumption = {**target, "tokens_per_step": args.target_tokens_per_step, "compute_s": target_s,
                  "grad_bytes": g_target, "nodes": NODES, "sim_compute_s": compute_s,
                  "sim_grad_bytes": g_sim, "scale": scale, "sim_rate_gbps": rates,
                  "comm_over_compute": comm_over_compute(target["tokens_per_s"]),
                  "warmup_steps": warmup_steps(args.steps),
                  "powersgd_wire_share": {"sim": powersgd_share["tiny"],
                                          "target": powersgd_share["124m"]},
                  "other_targets": {k: comm_over_compute(v["tokens_per_s"])
                                    for k, v in TARGETS.items() if k != args.target}}
    print(scale_line(assumption))
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = {NODES}\ntier = "1g"\n'
        f'isolation = "netns"\nprivate_cidr = "{CIDR}"\nrdzv_port = 29584\n'
        f'link_gbps = {rates["1g"]:.6f}\n')
    project = load_project(root / "fatpipe.toml")
    results: list[dict] = []
    try:
        deploy_cluster(project, project.cluster(CLUSTER))
        plan = [("10g none", "10g", ["--comm", "none"]), ("1g none", "1g", ["--comm", "none"]),
                ("1g auto", "1g", ["--comm", "auto", "--auto-periodic"]),
                ("1g powersgd", "1g", ["--comm", "powersgd"])]
        for label, tier, extra in plan:
            results.append(run_config(root, label, tier, rates, train + extra, reshape_node))
        method, h = periodic_choice(results[2]["decision"], args.steps)
        results.append(run_config(root, f"1g {method} H={h}", "1g", rates,
                                  train + ["--comm", method, "--sync-every", str(h)], reshape_node))
    finally:
        destroy_cluster(project, project.cluster(CLUSTER))
        shutil.rmtree(root, ignore_errors=True)
    doc = {"bench": "seed_table",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": host(), "assumption": assumption, "configs": results}
    doc["ratios"] = report(results, assumption)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "seed_table.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(results, assumption, out / "seed_table.png")
    print(f"wrote {out / 'seed_table.json'} and {out / 'seed_table.png'}")
    return 0


def warmup_steps(steps: int) -> int:
    """llm.c's share of LR warm-up steps, at least the 2 PowerSGD needs before it compresses."""
    return max(2, round(steps * LLMC_WARMUP_SHARE))


def scale_line(a: dict) -> str:
    return (f"scale: target {a['name']}: {a['tokens_per_s']:,.0f} tokens/s per GPU x "
            f"{a['tokens_per_step']:,} tokens/step = {a['compute_s'] * 1e3:.1f} ms compute/step, "
            f"{a['grad_bytes'] / 1e6:.1f} MB of gradients; comm/compute on {a['nodes']} nodes "
            f"{a['comm_over_compute']['1g']:.1f} at 1 Gbit/s, {a['comm_over_compute']['10g']:.2f} "
            f"at 10. Sim: tiny preset, {a['sim_grad_bytes'] / 1e6:.2f} MB, "
            f"{a['sim_compute_s'] * 1e3:.1f} ms compute/step measured here -> links x"
            f"{a['scale']:.5f}: 1g = {a['sim_rate_gbps']['1g'] * 1e3:.1f} Mbit/s, "
            f"10g = {a['sim_rate_gbps']['10g'] * 1e3:.1f} Mbit/s "
            f"(source: {a['source']}); other targets' comm/compute at 1/10 Gbit/s: "
            + ", ".join(f"{k} {v['1g']:.1f} / {v['10g']:.2f}"
                        for k, v in a["other_targets"].items())
            + f". PowerSGD (rank 4) sends {a['powersgd_wire_share']['sim']:.1%} of the sim's "
            f"gradient bytes, {a['powersgd_wire_share']['target']:.2%} of the target's")


def fatpipe(root: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=root, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})


def calibrate(root: Path, train: list[str], nodes: int = NODES) -> float:
    """Seconds of one step's compute with `nodes` ranks on this machine and nothing sent: local
    SGD whose only sync is the last step's; the median of the other steps."""
    out = root / f"calibrate-{nodes}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nodes), "-m", "fatpipe.trainer", *train, "--comm", "localsgd", "--sync-every",
           "100000", "--out", str(out)]
    done = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1",
                                            "GLOO_SOCKET_IFNAME": "lo"})
    if done.returncode:
        raise SystemExit(f"calibration run failed:\n{done.stdout[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = sorted(r["step_s"] for r in records[1:] if not r["wire_bytes"])
    return steps[len(steps) // 2]


def run_config(root: Path, label: str, tier: str, rates: dict, train: list[str],
               reshape_node, cluster: str = CLUSTER, nodes: int = NODES) -> dict:
    """Launch `train` on the deployed sim `cluster` with every link at `rates[tier]`."""
    for i in range(nodes):
        reshape_node(cluster, i, rates[tier])
    extra = ["--no-redecide"] if _has_train_key("redecide") else []
    done = fatpipe(root, "launch", cluster, *train, *extra, "--max-restarts", "0",
                   "--timeout", "1100")
    if done.returncode:
        raise SystemExit(f"{label}: launch failed:\n{done.stdout[-4000:]}")
    runs = root / ".fatpipe" / cluster / "runs"
    run_dir = runs / (runs / "latest").read_text().strip()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"{label}: {summary['comm']}, step p50 {summary['step_s_p50'] * 1e3:.0f} ms, "
          f"final loss {summary['final_loss']:.3f}")
    return {"label": label, "tier": tier, "rate_gbps": rates[tier], "comm": summary["comm"],
            "records": records, "summary": {k: v for k, v in summary.items()
                                            if k not in ("param_digests",)},
            "decision": summary.get("comm_decision"), "eval_loss": summary["eval_loss"]}


def _has_train_key(key: str) -> bool:
    from fatpipe.infra.trainspec import TrainSpec

    return key in TrainSpec.model_fields


def periodic_choice(decision: dict | None, steps: int) -> tuple[str, int]:
    """The periodic method auto chose (or, when it chose a hook, the one it prefers) and the
    interval it computed for this link."""
    from fatpipe.trainer.config import PERIODIC_NAMES

    decision = decision or {}
    name = decision.get("comm") if decision.get("comm") in PERIODIC_NAMES else PERIODIC_NAMES[0]
    h = (decision.get("predicted") or {}).get(name, {}).get("sync_every") or max(2, steps // 4)
    return name, int(h)


def host() -> dict:
    import torch

    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "load_average": os.getloadavg()}


if __name__ == "__main__":
    sys.exit(main())
