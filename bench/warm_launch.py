"""`fatpipe launch -- examples/ddp_script.py` to its first step on warm nodes, against torchrun by hand.

Part of bench/first_step.py. The nodes are warm: the environment and the project are in place
(one launch before the timed ones). Then, alternating which goes first, `--repeat` times each:

- launch: `fatpipe launch CLUSTER -- examples/ddp_script.py`, as a user types it;
- by hand: the same script with the same rendezvous, started with one ssh per node running the
  torchrun command fatpipe wrote for that node (`node-<i>.sh`, runnable by hand), all at once:
  the floor torch itself sets (torchrun's agents, their rendezvous, the workers' start).

Each is timed from its start on this machine to the first step recorded in node 0's run folder
(`metrics.jsonl`, written by `fatpipe.step` after the script's first optimizer step), and waited
for to its end. The goal (issue 35): launch at most 1.3x by hand, medians.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fatpipe.ops.reach.transport import transports_for

SCRIPT = "examples/ddp_script.py"
STEPS = "5"
FIRST_STEP_TIMEOUT_S = 600


def first_step(metrics: Path, started: float, procs: list[subprocess.Popen]) -> float:
    """Seconds from `started` until `metrics` holds a line; nan when every process ended first."""
    deadline = started + FIRST_STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        if metrics.exists() and metrics.stat().st_size > 0:
            return time.monotonic() - started
        if all(p.poll() is not None for p in procs):
            return float("nan")
        time.sleep(0.05)
    return float("nan")


def runs_dir(outputs, cluster: str) -> Path:
    return Path(outputs.nodes[0].remote_dir) / ".fatpipe" / cluster / "runs"


def by_launch(folder: Path, cli_argv: list[str], env: dict, outputs, cluster: str) -> tuple[float, str]:
    """`fatpipe launch` to its first step; the new run's id."""
    before = set(runs_dir(outputs, cluster).glob("*")) if runs_dir(outputs, cluster).exists() else set()
    started = time.monotonic()
    proc = subprocess.Popen([*cli_argv, "launch", cluster, "--", SCRIPT, "--steps", STEPS], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds, run = float("nan"), ""
    while time.monotonic() < started + FIRST_STEP_TIMEOUT_S and proc.poll() is None:
        new = [d for d in runs_dir(outputs, cluster).glob("*") if d not in before and d.is_dir()]
        if new and (new[0] / "metrics.jsonl").exists() and (new[0] / "metrics.jsonl").stat().st_size > 0:
            seconds, run = time.monotonic() - started, new[0].name
            break
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=FIRST_STEP_TIMEOUT_S)
    if proc.returncode or not run:
        print(out[-3000:], file=sys.stderr)
        raise SystemExit(f"fatpipe launch failed (exit {proc.returncode})")
    return seconds, run


def by_hand(project, outputs, cluster: str, run: str) -> float:
    """One ssh per node running that node's torchrun command of `run`, all at once, to the first step."""
    transports = transports_for(outputs, project.state_dir(cluster))
    metrics = runs_dir(outputs, cluster) / run / "metrics.jsonl"
    for name in ("metrics.jsonl", "summary.json"):
        (metrics.parent / name).unlink(missing_ok=True)
    shutil.rmtree(metrics.parent / "checkpoints", ignore_errors=True)  # a fresh start, not a resume
    rel = f".fatpipe/{cluster}/runs/{run}"
    started = time.monotonic()
    procs = [t.popen(f"cd {node.remote_dir} && bash {rel}/node-{i}.sh")
             for i, (t, node) in enumerate(zip(transports, outputs.nodes, strict=True))]
    seconds = first_step(metrics, started, procs)
    outs = [p.communicate(timeout=FIRST_STEP_TIMEOUT_S)[0] for p in procs]
    if any(p.returncode for p in procs) or seconds != seconds:
        print(outs[0][-3000:], file=sys.stderr)
        raise SystemExit(f"torchrun by hand failed: exits {[p.returncode for p in procs]}")
    return seconds


def compare(folder: Path, cli_argv: list[str], env: dict, repeat: int) -> dict:
    """Warm the nodes with one launch, then both ways alternating; medians and the ratio."""
    import json

    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.infra.project import load_project

    (folder / "examples").mkdir(exist_ok=True)
    shutil.copy(Path(__file__).resolve().parent.parent / SCRIPT, folder / SCRIPT)
    project = load_project(folder / "fatpipe.toml")
    outputs = parse_outputs(json.loads(next((folder / ".fatpipe").glob("*/outputs.json")).read_text()))
    cluster = outputs.name
    warm_s, run = by_launch(folder, cli_argv, env, outputs, cluster)  # the environment and project land
    launch, hand = [], []
    for i in range(repeat):
        for way in (("launch", "hand") if i % 2 == 0 else ("hand", "launch")):
            if way == "launch":
                seconds, run = by_launch(folder, cli_argv, env, outputs, cluster)
                launch.append(seconds)
            else:
                hand.append(by_hand(project, outputs, cluster, run))
            print(f"  {way:>6}: {(launch if way == 'launch' else hand)[-1]:5.1f} s to the first step", flush=True)
    med_launch, med_hand = statistics.median(launch), statistics.median(hand)
    return {"warm_up_launch_s": warm_s, "launch_s": launch, "hand_s": hand, "launch_median_s": med_launch,
            "hand_median_s": med_hand, "ratio": med_launch / med_hand, "goal": 1.3,
            "met": med_launch / med_hand <= 1.3}


def print_table(doc: dict, nodes: int) -> None:
    print(f"{nodes} warm nodes, {SCRIPT} to its first step: median of {len(doc['launch_s'])}, alternating")
    print(f"  fatpipe launch  {doc['launch_median_s']:6.1f} s  ({', '.join(f'{s:.1f}' for s in doc['launch_s'])})")
    print(f"  torchrun by hand{doc['hand_median_s']:6.1f} s  ({', '.join(f'{s:.1f}' for s in doc['hand_s'])})")
    print(f"  ratio {doc['ratio']:.2f} (goal <= 1.3: {'met' if doc['met'] else 'missed'})")
