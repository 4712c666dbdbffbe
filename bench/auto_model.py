"""comm=auto's model against the run: predicted step beside measured, on a shaped netns sim.

Deploys one sim cluster (netns, every link shaped with tc tbf), then for each link rate runs
the built-in trainer (tiny preset) with each fixed comm hook and with comm=auto, side by side
on the same cluster, and prints per rate: what auto chose, its predicted step, the measured step
p50 of every run, tokens/s and the ratio to comm=none. Then the mid-run cut: a run starts at
--cut-from Mbit/s, every link drops to --cut-to once --cut-at steps are logged; comm=auto (which
may re-decide) runs against the same cut with its first choice held (--no-redecide).

    sudo .venv/bin/python bench/auto_model.py [--rates 25 50 1000] [--steps 40] [--nodes 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

NAME, OCTET = "acb", 93


def cli(folder: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout)


def reshape_all(nodes: int, mbit: float) -> None:
    from fatpipe.stacks.sim.net import reshape_node

    for i in range(nodes):
        reshape_node(NAME, i, mbit / 1000)


def _runs(folder: Path) -> list[Path]:
    return [p for p in (folder / ".fatpipe" / NAME / "runs").glob("2*") if p.is_dir()]


def latest_run(folder: Path) -> Path:
    return max(_runs(folder))


def launch(folder: Path, args, comm: str, *extra: str, cut=None) -> dict:
    """One run; its summary plus wall time. `cut`: (steps, nodes, mbit) applied mid-run."""
    flags = ["--preset", "tiny", "--steps", str(args.steps), "--comm", comm,
             "--warmup-steps", "3", "--checkpoint-every", str(args.every), *extra]
    start = time.monotonic()
    watcher = None
    if cut:
        before = set(_runs(folder))
        watcher = threading.Thread(target=_cut_when, args=(folder, before, *cut), daemon=True)
        watcher.start()
    done = cli(folder, "launch", NAME, *flags, "--max-restarts", "0")
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"launch --comm {comm} failed:\n{done.stdout[-3000:]}")
    if watcher:
        watcher.join(timeout=5)
    run = latest_run(folder)
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {**summary, "wall_s": wall, "train_s": sum(r["step_s"] for r in records)}


def _cut_when(folder: Path, before: set[Path], steps: int, nodes: int, mbit: float) -> None:
    """Cut every link once this launch's (new) run has logged `steps` steps."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        for run in set(_runs(folder)) - before:
            metrics = run / "metrics.jsonl"
            if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
                reshape_all(nodes, mbit)
                return
        time.sleep(0.2)


def table(folder: Path, args) -> None:
    print(f"{'rate':>9} | {'run':>18} | {'predicted':>9} | {'p50 step':>9} | {'tokens/s':>8} |"
          f" {'vs none':>7} | {'error':>6}")
    for mbit in args.rates:
        reshape_all(args.nodes, mbit)
        rows = {comm: launch(folder, args, comm) for comm in (*args.comms, "auto")}
        if rows["auto"]["comm"] not in rows:  # auto's choice, held fixed, is a fixed choice too
            rows[rows["auto"]["comm"]] = launch(folder, args, rows["auto"]["comm"])
        base = rows["none"]["tokens_per_s"] if "none" in rows else None
        best = max(s["tokens_per_s"] for c, s in rows.items() if c != "auto")
        for comm, s in rows.items():
            pred = s.get("comm_prediction") or {}
            predicted = pred.get("predicted_step_s")
            label = f"auto -> {s['comm']}" if comm == "auto" else comm
            p50 = s["step_s_p50"]
            pred_ms = f"{predicted * 1e3:.0f} ms" if predicted else "-"
            error = f"{p50 / predicted - 1:+.0%}" if predicted else "-"
            print(f"{mbit:>5g} Mb/s | {label:>18} | {pred_ms:>9} | {p50 * 1e3:>6.0f} ms | "
                  f"{s['tokens_per_s']:>8,.0f} | {s['tokens_per_s'] / base if base else 0:>7.2f}"
                  f" | {error:>6}")
        print(f"{mbit:>5g} Mb/s: auto / best fixed tokens/s = "
              f"{rows['auto']['tokens_per_s'] / best:.2f}", flush=True)


def cut_run(folder: Path, args) -> None:
    reshape_all(args.nodes, args.cut_from)
    cut = (args.cut_at, args.nodes, args.cut_to)
    auto = launch(folder, args, "auto", cut=cut)
    first = auto["comm_decision"]["switches"][0]["from"] if auto["comm_decision"]["switches"] \
        else auto["comm"]
    reshape_all(args.nodes, args.cut_from)
    held = launch(folder, args, "auto", "--no-redecide", cut=cut)
    print(f"cut {args.cut_from:g} -> {args.cut_to:g} Mbit/s after step {args.cut_at} "
          f"(checkpoint every {args.every}):")
    for sw in auto["comm_decision"]["switches"]:
        print(f"  auto switched {sw['from']} -> {sw['to']} at step {sw['step']} "
              f"(measured p50 {sw['measured_step_s_p50'] * 1e3:.0f} ms, predicted "
              f"{sw['predicted_step_s_before'] * 1e3:.0f}; after: "
              f"{sw['predicted_run_step_s'] * 1e3:.0f} ms/step; paused {sw['pause_s']:.1f} s, "
              f"of which re-probe {sw['probe_s']:.1f} s)")
    for label, s in (("auto (re-decides)", auto), (f"auto held on {held['comm']}", held)):
        print(f"  {label:>24}: switches {s.get('comm_switches', 0)}, train time "
              f"{s['train_s']:.1f} s, wall {s['wall_s']:.1f} s, p50 {s['step_s_p50'] * 1e3:.0f} ms")
    print(f"  first choice {first}; train time ratio held / auto = "
          f"{held['train_s'] / auto['train_s']:.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=[25, 50, 1000], help="Mbit/s")
    p.add_argument("--comms", nargs="+", default=["none", "bf16", "powersgd"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5, help="checkpoint interval (steps)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--cut-from", type=float, default=1000, help="Mbit/s")
    p.add_argument("--cut-to", type=float, default=50, help="Mbit/s")
    p.add_argument("--cut-at", type=int, default=12, help="steps logged before the cut")
    p.add_argument("--skip-table", action="store_true")
    p.add_argument("--skip-cut", action="store_true")
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="auto_model-"))
    (folder / "fatpipe.toml").write_text(
        f'[clusters.{NAME}]\nprovider = "sim"\nnodes = {args.nodes}\ntier = "1g"\n'
        f'isolation = "netns"\nprivate_cidr = "10.{OCTET}.0.0/24"\nrdzv_port = {29500 + OCTET}\n')
    done = cli(folder, "deploy", NAME, "--yes")
    if done.returncode != 0:
        raise SystemExit(f"deploy failed:\n{done.stdout[-3000:]}")
    try:
        if not args.skip_table:
            table(folder, args)
        if not args.skip_cut:
            cut_run(folder, args)
    finally:
        cli(folder, "down", NAME, timeout=300)


if __name__ == "__main__":
    main()
