"""`fatpipe plan` checked against what happens: three time-scaled sim clusters, predicted and run.

Each configuration (a node count and a tier, run with comm=auto) is rehearsed the way
bench/seed_table.py rehearses the seed's table, with its machinery: the sim's compute per step is
measured first with that many ranks, and the tier's rate is scaled by as much as the sim's
compute is slower than the target GPU node's (an RTX 4090 on GPT-2 124M, llm.c's 524,288 tokens
per step shared by the nodes), so each link carries what the target's would. The prediction
is `ops.plan.plan.predict`, the code `fatpipe plan` runs, for the same job: the sim's model (its
exact shapes), its measured compute, the scaled link as the machine's baseline, the same node
count, steps and warm-up. Per configuration it prints the predicted and measured mean step,
exposed share and method, and the step's error (goal: within 15%); writes
bench/results/plan_check.json (with every run's per-step records, so `--from-json` redoes the
comparison without running anything). Needs root (network namespaces, tc) and terraform.

    sudo .venv/bin/python bench/plan_check.py [--steps 30]
    .venv/bin/python bench/plan_check.py --from-json bench/results/plan_check.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_table import GLOBAL_BATCH_TOKENS, TARGETS, calibrate, host, run_config  # noqa: E402

# (nodes, tier): node counts, tiers and the methods auto picks differ from row to row.
CONFIGS = [(2, "10g"), (3, "10g"), (4, "1g")]
GOAL = 0.15  # the step's relative error each prediction must stay within
CIDR_BASE, PORT_BASE = "10.197", 29761  # one /24 and rendezvous port per node count


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--target", choices=sorted(TARGETS), default="rtx4090")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--from-json", type=Path, help="recompute the comparison from a plan_check.json")
    args = p.parse_args()
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        vars(args).update(doc["args"])
        doc["rows"] = [compare(args, row) for row in doc["rows"]]
        print("\n".join(row_line(r) for r in doc["rows"]) + "\n" + table(doc["rows"]))
        return write(doc, Path(args.out))
    if os.geteuid() != 0 or not shutil.which("terraform"):
        print("needs root (network namespaces, tc) and terraform on PATH")
        return 0
    root = Path(tempfile.mkdtemp(prefix="fatpipe-plan-check-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` tears clusters down
    train = ["--preset", "tiny", "--steps", str(args.steps), "--batch-size", str(args.batch_size),
             "--seq-len", str(args.seq_len), "--warmup-steps", str(args.warmup_steps),
             "--checkpoint-every", str(args.steps), "--seed", "1337"]
    rows = []
    try:
        for nodes, tier in CONFIGS:
            rows.append(check(root, args, train, nodes, tier))
            print(row_line(rows[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(rows))
    doc = {"bench": "plan_check", "goal": GOAL, "target": TARGETS[args.target],
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": host(), "args": {k: getattr(args, k) for k in ("steps", "batch_size", "seq_len",
                                                                 "warmup_steps", "target")},
           "rows": rows}
    return write(doc, Path(args.out))


def write(doc: dict, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_check.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / 'plan_check.json'}")
    return 0


def sim_traffic(seq_len: int):
    """The sim model's exact size and PowerSGD wire bytes, as `ops.plan.plan` counts a preset's."""
    from fatpipe.ops.plan.plan import _DEFAULTS, ModelTraffic
    from fatpipe.trainer.comm.costmodel import powersgd_wire_elements
    from fatpipe.trainer.model import GPT, preset_config

    shapes = [t.shape for t in GPT(preset_config("tiny", seq_len)).parameters()]
    params = sum(math.prod(s) for s in shapes)
    return ModelTraffic(params, powersgd_wire_elements(shapes, _DEFAULTS.powersgd_rank) * 4)


def scaled_rate(args, nodes: int, tier: str, compute_s: float, sim_params: int) -> float:
    """The tier's rate scaled as bench/seed_table.py scales it, for `nodes` nodes."""
    from fatpipe.infra.spec import TIER_GBPS
    from fatpipe.ops.plan.plan import model_traffic

    target_s = GLOBAL_BATCH_TOKENS / nodes / TARGETS[args.target]["tokens_per_s"]
    return TIER_GBPS[tier] * sim_params / model_traffic("124m").params * target_s / compute_s


def predict_sim(args, nodes: int, tier: str, rate_gbps: float, compute_s: float, probe: dict | None = None):
    """`fatpipe plan`'s prediction for the sim job: ops.plan.plan.predict on a machine whose baseline
    is the scaled link and an accelerator whose tokens/s is the compute measured here; with
    `probe` (the link comm=auto measured) on that link instead, as `fatpipe plan` plans a
    declared cluster whose netcheck measured its link."""
    from fatpipe.infra.catalog import MachineType
    from fatpipe.infra.jobmodel import REFERENCE_PARAMS, Accelerator, Job
    from fatpipe.ops.plan.plan import Candidate, predict
    from fatpipe.trainer.comm.decision import LinkEstimate

    traffic = sim_traffic(args.seq_len)
    per_rank = args.batch_size * args.seq_len
    accel = Accelerator("sim CPU rank", per_rank / compute_s * traffic.params / REFERENCE_PARAMS,
                        "measured here (seed_table.calibrate)", gpus=0)  # gloo, as the sim runs
    job = Job(traffic.params, args.steps * nodes * per_rank, nodes * per_rank, args.warmup_steps)
    machine = MachineType(f"sim {rate_gbps * 1e3:.1f} Mbit/s", rate_gbps, rate_gbps, 0, 0.0)
    link = None
    if probe:
        link = LinkEstimate(float(probe["busbw_gbps"]), float(probe.get("latency_s", 0.0)),
                            "probe", dict(probe.get("half_rate") or {}))
    return predict(job, accel, traffic, Candidate("sim", machine, tier, nodes, measured=link))


def check(root: Path, args, train: list[str], nodes: int, tier: str) -> dict:
    """Deploy a `nodes`-node sim at the scaled `tier`, run comm=auto on it, destroy it."""
    from fatpipe.infra.project import load_project
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster
    from fatpipe.stacks.sim.net import reshape_node

    compute_s = calibrate(root, train, nodes)
    rate = scaled_rate(args, nodes, tier, compute_s, sim_traffic(args.seq_len).params)
    name = f"pc-check-{nodes}"
    folder = root / name
    folder.mkdir()
    (folder / "fatpipe.toml").write_text(
        f'[clusters.{name}]\nprovider = "sim"\nnodes = {nodes}\ntier = "{tier}"\n'
        f'isolation = "netns"\nprivate_cidr = "{CIDR_BASE}.{nodes}.0/24"\n'
        f'rdzv_port = {PORT_BASE + nodes}\nlink_gbps = {rate:.6f}\n')
    project = load_project(folder / "fatpipe.toml")
    try:
        deploy_cluster(project, project.cluster(name))
        run = run_config(folder, f"{nodes} nodes {tier} auto", tier, {tier: rate},
                         train + ["--comm", "auto"], reshape_node, name, nodes)
    finally:
        destroy_cluster(project, project.cluster(name))
    kept = ("step", "step_s", "exposed_comm_s", "sync_s", "wire_bytes", "busbw_gbps", "comm")
    raw = {"nodes": nodes, "tier": tier, "sim_rate_gbps": rate, "calibrated_compute_s": compute_s,
           "method": run["comm"], "decision": run["decision"],
           "records": [{k: r.get(k) for k in kept} for r in run["records"]]}
    return compare(args, raw)


def compare(args, raw: dict) -> dict:
    """The plan's prediction for a run against what the run measured.

    The plan's compute input is the accelerator's throughput; the sim's is what its CPU does
    while the run runs, which on a shared machine moves with the load (the calibration before
    the run only sets the link scale). So the prediction is made twice: on the compute the run
    itself spent per step (its step less its exposed communication: this isolates what the
    plan adds, the link, the method and its exposed share), and on the compute comm=auto
    measured at the run's start (forward and backward, nothing sent), as a user's own figure;
    and a third time on the in-run compute and the link comm=auto's probe measured (bandwidth
    and latency), as `fatpipe plan` plans a cluster whose netcheck measured it.
    """
    plain = max(2, args.warmup_steps) if raw["method"] == "powersgd" else 0  # as the trainer's
    measured = measure(raw["records"], plain)
    decision = raw["decision"] or {}
    start_s = decision.get("compute_s") or raw["calibrated_compute_s"]
    rows = {}
    for key, compute_s, probe in (("predicted", measured["compute_s"], None),
                                  ("predicted_on_probe", measured["compute_s"], decision.get("link")),
                                  ("predicted_at_start", start_s, None)):
        plan = predict_sim(args, raw["nodes"], raw["tier"], raw["sim_rate_gbps"], compute_s, probe)
        rows[key] = {"method": plan.method, "step_s": plan.step_s, "share": plan.exposed_share,
                     "compute_s": plan.compute_s, "link_gbps": plan.link.gbps, "reason": plan.reason,
                     "step_error": plan.step_s / measured["step_s"] - 1}
    return {**raw, **rows, "measured": measured, "step_error": rows["predicted"]["step_error"],
            "share_error": rows["predicted"]["share"] - measured["share"]}


def measure(records: list[dict], plain_steps: int = 0) -> dict:
    """The run's mean step over all its steps (the plan predicts the whole job's), the compute
    (and hook) the rest of each step was, and the share communication left exposed once the
    method runs (after PowerSGD's `plain_steps`), as the plan's exposed share counts it."""
    total = sum(r["step_s"] for r in records)
    exposed = sum(r["exposed_comm_s"] for r in records)
    after = records[plain_steps:] or records
    return {"step_s": total / len(records), "compute_s": (total - exposed) / len(records),
            "share": sum(r["exposed_comm_s"] for r in after) / sum(r["step_s"] for r in after),
            "step_s_p50": statistics.median(r["step_s"] for r in records), "steps": len(records)}


def row_line(r: dict) -> str:
    p, m = r["predicted"], r["measured"]
    return (f"{r['nodes']} nodes {r['tier']} ({r['sim_rate_gbps'] * 1e3:.0f} Mbit/s, compute "
            f"{p['compute_s'] * 1e3:.0f} ms): plan {p['method']} {p['step_s'] * 1e3:.0f} ms "
            f"{p['share']:.0%} exposed; run {m['step_s'] * 1e3:.0f} ms "
            f"{m['share']:.0%} exposed, {r['method']}; step error {r['step_error']:+.1%} "
            f"(on auto's start-of-run compute {r['predicted_at_start']['compute_s'] * 1e3:.0f} ms: "
            f"{r['predicted_at_start']['method']}, {r['predicted_at_start']['step_error']:+.1%}; on the "
            f"probed link: {r['predicted_on_probe']['method']}, {r['predicted_on_probe']['step_error']:+.1%})")


def table(rows: list[dict]) -> str:
    lines = ["| nodes | tier (sim rate) | compute in run | plan: method, step, exposed | run: method, "
             "step, exposed | step error | within 15% | on the probed link: method, step, error "
             "| on start-of-run compute: method, error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p, m, q = r["predicted"], r["measured"], r["predicted_on_probe"]
        lines.append(
            f"| {r['nodes']} | {r['tier']} ({r['sim_rate_gbps'] * 1e3:.0f} Mbit/s) | "
            f"{m['compute_s'] * 1e3:.0f} ms | {p['method']}, "
            f"{p['step_s'] * 1e3:.0f} ms, {p['share']:.0%} | {r['method']}, {m['step_s'] * 1e3:.0f} ms, "
            f"{m['share']:.0%} | {r['step_error']:+.1%} | {'yes' if abs(r['step_error']) <= GOAL else 'no'} | "
            f"{q['method']}, {q['step_s'] * 1e3:.0f} ms, {q['step_error']:+.1%} | "
            f"{r['predicted_at_start']['method']} ({r['predicted_at_start']['compute_s'] * 1e3:.0f} ms), "
            f"{r['predicted_at_start']['step_error']:+.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
