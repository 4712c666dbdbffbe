"""Goodput under node faults: fault_tolerance = "live" against "restart" and a fault-free run.

One 4-node netns sim cluster, its links time-scaled to the RTX 4090 regime as seed_table.py scales
them (gradient bytes over compute as a 4090 node on a 1 Gbit/s link sees them). Each node's
processes are held to their own share of this machine's CPUs (a cgroup per node, cpu quota =
cores / nodes, every process of its namespace moved in as it appears), so a killed node frees no
CPU for the others and the nodes that are up have the capacity the ceiling below assumes.

The fault: every --kill-every seconds a node chosen by a seeded draw (node 0 among them at least
once) loses its torchrun agent, workers and Lighthouse (kill -9) and stays down --down seconds
(its supervisor and keeper stopped meanwhile, then let go: the keeper starts torchrun again).
When the victim is node 0 under live, its Lighthouse and relay go down with it for the same time
(the others move to node 1's). The
same schedule runs under live and under restart; a fault-free live run gives the rate the
ceiling is measured against, and a fault-free restart run beside it what live itself costs:

    ceiling = fault-free tokens/s x (node-seconds up / node-seconds of the run)

Printed, side by side: goodput (committed tokens per second of the run's wall time), its share
of the ceiling (goal >= 0.95), steps node 0 took twice (goal 0 under live), each kill's time to
the survivors' next step (goal <= 10 s), and the final eval loss against the fault-free run's.
Writes bench/results/faults.json. Needs root (namespaces, tc, cgroups) and terraform.

    sudo .venv/bin/python bench/faults.py [--duration 240] [--kill-every 60] [--down 20] [--no-flaps] [--live-only]
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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_table import GLOBAL_BATCH_TOKENS, TARGETS, calibrate, host  # noqa: E402

CLUSTER, CIDR, NODES = "fl-bench", "10.86.0.0/24", 4
CGROUP = Path("/sys/fs/cgroup/cpu")
NODE_IFACE = "eth0"  # the node's end of its veth (fatpipe.stacks.sim.links)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=240, help="seconds of the fault-free run (it sets the step count)")
    p.add_argument("--kill-every", type=float, default=60)
    p.add_argument("--down", type=float, default=20)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-flaps", dest="flaps", action="store_false",
                   help="skip the link-flap runs (one node's link down 2 s every 30 s)")
    p.add_argument("--live-only", action="store_true",
                   help="the fault-free and faulted live runs alone (the ceiling and the goodput, no restart runs)")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("terraform") or not CGROUP.is_dir():
        print("needs root (network namespaces, tc, the cgroup cpu controller) and terraform")
        return 0
    from fatpipe.infra.project import load_project
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster
    from fatpipe.trainer.model import GPT, preset_config

    root = Path(tempfile.mkdtemp(prefix="fatpipe-faults-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` tears down
    train = ["--preset", "tiny", "--batch-size", "8", "--seq-len", "64", "--warmup-steps", "20",
             "--checkpoint-every", "25", "--comm", "none", "--seed", "1337", "--eval-windows", "32"]
    compute_s = calibrate(root, [*train, "--steps", "30"])
    elements = {p: sum(math.prod(t.shape) for t in GPT(preset_config(p, 64)).parameters())
                for p in ("tiny", "124m")}
    target_s = GLOBAL_BATCH_TOKENS / NODES / TARGETS["rtx4090"]["tokens_per_s"]
    rate = 1 * (elements["tiny"] / elements["124m"]) * (target_s / compute_s)
    print(f"sim compute {compute_s * 1e3:.0f} ms/step; links at {rate:.4f} Gbit/s (1 Gbit/s "
          f"for a 4090 node)")
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = {NODES}\ntier = "1g"\n'
        f'isolation = "netns"\nprivate_cidr = "{CIDR}"\nrdzv_port = 29684\n'
        f'link_gbps = {rate:.6f}\n')
    project = load_project(root / "fatpipe.toml")
    runs, schedule = [], []
    quotas = NodeQuotas()
    try:
        deploy_cluster(project, project.cluster(CLUSTER))
        # The fault-free run's steps take about --duration; the faulted runs take the same
        # steps, with the faults on a schedule inside that time.
        probe = run_one(root, "probe", [*train, "--steps", "40", "--fault-tolerance", "live"], [], args)
        step_s = probe["wall_s"] / 40
        steps = int(args.duration / step_s)
        print(f"{step_s * 1e3:.0f} ms per step with 4 nodes: {steps} steps per run")
        schedule = fault_schedule(args)
        # The first row is the ceiling's; the second prices live itself (the Manager's quorum
        # and all-reduce each step) against restart's one torchrun world, fault-free both.
        for label, mode, faults in (("fault-free", "live", []), ("fault-free, restart", "restart", []),
                                    ("live", "live", schedule), ("restart", "restart", schedule)):
            if args.live_only and mode != "live":
                continue
            runs.append(run_one(root, label, [*train, "--steps", str(steps), "--fault-tolerance",
                                              mode], faults, args))
        flaps = [{"at_s": t, "node": 1, "flap_s": 2.0}
                 for t in range(30, int(args.duration) - 10, 30)] if args.flaps else []
        for label, mode in (("live, flaps", "live"), ("restart, flaps", "restart")):
            if flaps and not (args.live_only and mode != "live"):
                runs.append(run_one(root, label, [*train, "--steps", str(steps),
                                                  "--fault-tolerance", mode], flaps, args))
    finally:
        quotas.stop()
        destroy_cluster(project, project.cluster(CLUSTER))
        shutil.rmtree(root, ignore_errors=True)
    table = compare(runs, args)
    doc = {"bench": "faults", "host": host(), "link_gbps": rate, "compute_s": compute_s,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "args": vars(args), "schedule": schedule, "runs": table}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "faults.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / 'faults.json'}")
    return 0


def fault_schedule(args) -> list[dict]:
    """(seconds into the run, victim) for every kill; node 0 is among the victims."""
    draw = random.Random(args.seed)
    times = [args.kill_every * k for k in range(1, int(args.duration // args.kill_every) + 1)
             if args.kill_every * k + args.down < args.duration]
    victims = [draw.randrange(NODES) for _ in times]
    if victims and 0 not in victims:
        victims[len(victims) // 2] = 0
    return [{"at_s": t, "node": v} for t, v in zip(times, victims, strict=True)]


class NodeQuotas:
    """Each node's namespace's processes in a cpu cgroup of its own: cores / nodes of CPU."""

    def __init__(self):
        self.groups = []
        for i in range(NODES):
            group = CGROUP / f"fatpipe-bench-node-{i}"
            group.mkdir(exist_ok=True)
            period = int((group / "cpu.cfs_period_us").read_text())
            (group / "cpu.cfs_quota_us").write_text(str(period * os.cpu_count() // NODES))
            self.groups.append(group)
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._keep, daemon=True)
        self.thread.start()

    def _keep(self) -> None:
        while not self.halt.wait(0.3):
            for i, group in enumerate(self.groups):
                listed = subprocess.run(["ip", "netns", "pids", f"fp-{CLUSTER}-{i}"],
                                        capture_output=True, text=True).stdout.split()
                held = set((group / "cgroup.procs").read_text().split())
                for pid in set(listed) - held:
                    try:
                        (group / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass  # gone already

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(5)
        for group in self.groups:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (CGROUP / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            group.rmdir()


def node_processes(index: int) -> tuple[list[int], list[int]]:
    """(the node's supervisor and keeper, node programs run as `python3 -c` (node/supervisor.py),
    and any shell: to stop; the run's own processes: torchrun's agent and workers and the
    Lighthouse, to kill)."""
    keepers, run = [], []
    for pid in subprocess.run(["ip", "netns", "pids", f"fp-{CLUSTER}-{index}"],
                              capture_output=True, text=True).stdout.split():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "bash" or argv[1:2] == [b"-c"]:
            keepers.append(int(pid))
        elif comm.startswith("python") or comm.startswith("pt_"):
            run.append(int(pid))
    return keepers, run


def take_down(index: int, down_s: float) -> None:
    """The node's supervisor and keeper stopped, its run's processes killed (torchrun's agent, the
    workers, the Lighthouse); after `down_s` the supervisor and keeper go on: the keeper sees its
    attempt killed by a signal no `stop` sent and starts it again (and the Lighthouse)."""
    keepers, run = node_processes(index)
    for pid in keepers:
        _signal(pid, signal.SIGSTOP)
    for pid in run:
        _signal(pid, signal.SIGKILL)
    time.sleep(down_s)
    for pid in keepers:
        _signal(pid, signal.SIGCONT)


def flap(index: int, seconds: float) -> None:
    """The node's link down for `seconds` (the seed's flapping link), then up."""
    ns = f"fp-{CLUSTER}-{index}"
    subprocess.run(["ip", "-n", ns, "link", "set", NODE_IFACE, "down"], check=True)
    try:
        time.sleep(seconds)
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", NODE_IFACE, "up"], check=True)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def run_one(root: Path, label: str, train: list[str], faults: list[dict], args) -> dict:
    """One launch to its last step, with `faults` injected on their schedule."""
    log = open(root / f"{label}.log", "w")
    started = time.time()
    launch = subprocess.Popen(
        [sys.executable, "-m", "fatpipe.cli", "launch", CLUSTER, *train, "--max-restarts", "30",
         "--timeout", str(args.duration * 6)], cwd=root, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1"})
    runs = root / ".fatpipe" / CLUSTER / "runs"
    before = set(runs.glob("2*")) if runs.is_dir() else set()
    while launch.poll() is None:
        new = [r for r in runs.glob("2*") if r not in before and (r / "metrics.jsonl").exists()]
        if new:
            break
        time.sleep(0.1)
    if launch.poll() is not None:
        raise SystemExit(f"{label}: the launch ended before its first step:\n"
                         f"{(root / f'{label}.log').read_text()[-3000:]}")
    run_dir, first_step = new[0], time.time()
    kills = []
    for fault in faults:
        time.sleep(max(0.0, first_step + fault["at_s"] - time.time()))
        kills.append({**fault, "time": time.time()})
        inject = (flap, (fault["node"], fault["flap_s"])) if "flap_s" in fault else \
            (take_down, (fault["node"], args.down))
        threading.Thread(target=inject[0], args=inject[1], daemon=True).start()
    launch.wait(timeout=args.duration * 6 + 120)
    ended = time.time()
    # Each node's own records under live (node k's in live-node-<k>/, node 0's copy too): a node
    # that was down has no record of the steps the others took meanwhile. The run folder's is
    # the run's (merged from them under live, ops.run.headline).
    own_0 = run_dir / "live-node-0"
    by_node = [read_records(own_0 if own_0.is_dir() else run_dir) if i == 0
               else read_records(run_dir / f"live-node-{i}") for i in range(NODES)]
    records = read_records(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text()) \
        if (run_dir / "summary.json").exists() else {}
    print(f"{label}: exit {launch.returncode}, {len(records)} records, "
          f"{ended - first_step:.0f} s from the first step")
    return {"label": label, "mode": train[train.index("--fault-tolerance") + 1],
            "records": records, "by_node": by_node, "summary": summary, "kills": kills,
            "log": (run_dir / "node-0.log").read_text(errors="replace")
            if (run_dir / "node-0.log").exists() else "",
            "exit": launch.returncode,
            "wall_s": ended - first_step, "startup_s": first_step - started}


def compare(runs: list[dict], args) -> list[dict]:
    """The table: goodput, its share of the ceiling, steps taken twice, kill -> next step, loss."""
    node_tokens = 8 * 64  # batch x seq_len per node and step
    free = runs[0]
    free_rate = tokens(free, node_tokens) / free["wall_s"]
    rows = []
    for run in runs:
        down = sum(min(k.get("flap_s", args.down), run["wall_s"] - k["at_s"]) for k in run["kills"])
        alive_share = 1 - down / (NODES * run["wall_s"])
        goodput = tokens(run, node_tokens) / run["wall_s"]
        steps = [r["step"] for r in run["records"]]
        row = {"run": run["label"], "goodput_tokens_per_s": goodput,
               "ceiling_tokens_per_s": free_rate * alive_share,
               "of_ceiling": goodput / (free_rate * alive_share),
               "steps_taken_twice": len(steps) - len(set(steps)),
               "kill_to_next_step_s": [next_step(run, k) for k in run["kills"]],
               "stall_split": [stall_split(run, k) for k in run["kills"] if "flap_s" not in k],
               "rejoin": [rejoin(run, k) for k in run["kills"] if "flap_s" not in k],
               "eval_loss": run["summary"].get("eval_loss"), "exit": run["exit"],
               "committed_steps": len(set(steps)), "wall_s": run["wall_s"]}
        row["sync_failure_rate"] = sync_failure_rate(run)
        if free["summary"].get("eval_loss") and row["eval_loss"]:
            row["eval_loss_vs_fault_free"] = row["eval_loss"] / free["summary"]["eval_loss"]
        rows.append(row)
        print(f"{row['run']:>19}: goodput {goodput:8.0f} tok/s, {row['of_ceiling']:.3f} of the "
              f"ceiling, {row['steps_taken_twice']} steps twice, kill -> next step "
              f"{[round(s, 1) if s is not None else None for s in row['kill_to_next_step_s']]} s, "
              f"eval loss {row['eval_loss']}, sync failures {row['sync_failure_rate']}")
        for split in filter(None, row["stall_split"]):
            print(f"{'':>21}a kill's stall on a survivor: {split}")
        for back in filter(None, row["rejoin"]):
            print(f"{'':>21}its return, on a survivor: {back}")
    return rows


def sync_failure_rate(run: dict) -> float | None:
    """restart: the trainer's own (failed collectives over those attempted); live: node 0's step
    attempts that did not commit over all its attempts."""
    if run["mode"] == "restart":
        return run["summary"].get("sync_failure_rate")
    failed = run["log"].count("not committed (attempt")
    committed = len({r["step"] for r in run["records"]})
    return failed / (failed + committed) if committed else None


def read_records(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tokens(run: dict, node_tokens: int) -> int:
    """Committed tokens: each step once (as any node recorded it), times the nodes whose
    batches made it (every node under restart)."""
    by_step: dict[int, int] = {}
    for records in run["by_node"]:
        for r in records:
            by_step[r["step"]] = max(by_step.get(r["step"], 0), r.get("participants", NODES))
    return sum(by_step.values()) * node_tokens


def first_without(run: dict, kill: dict) -> dict | None:
    """A survivor's record of its first step without the victim (fewer replica groups than
    before the kill; live records carry `time` and `participants`, restart's do not: None). A
    step already under way at the kill ends with it or fails; this is the one after."""
    survivor = next(records for i, records in enumerate(run["by_node"]) if i != kill["node"])
    before = [r["participants"] for r in survivor if "time" in r and r["time"] <= kill["time"]]
    later = [r for r in survivor if r.get("time", 0) > kill["time"] and before and r["participants"] < before[-1]]
    return min(later, key=lambda r: r["time"]) if later else None


def next_step(run: dict, kill: dict) -> float | None:
    """Seconds from a kill to the end of the survivors' first step without the victim."""
    record = first_without(run, kill)
    return record["time"] - kill["time"] if record else None


def rejoin(run: dict, kill: dict) -> dict | None:
    """What the victim's return cost a survivor: its first step with more replica groups than the
    step before, after the victim went down; the seconds since that step before (`gap_s`, against
    a median step), the victim's seconds from the kill, and that step's quorum."""
    survivor = next(records for i, records in enumerate(run["by_node"]) if i != kill["node"])
    timed = [r for r in survivor if "time" in r]
    for before, record in zip(timed, timed[1:], strict=False):
        if record["time"] > kill["time"] and record["participants"] > before["participants"]:
            steps = sorted(r["step_s"] for r in timed)
            return {"back_after_kill_s": round(record["time"] - kill["time"], 1),
                    "gap_s": round(record["time"] - before["time"], 2),
                    "median_step_s": round(steps[len(steps) // 2], 2),
                    "quorum_s": round(record["quorum_s"], 2), "failed_s": record.get("failed_s")}
    return None


def stall_split(run: dict, kill: dict) -> dict | None:
    """Where a kill's stall went on a survivor, from its record of the first step without the
    victim: the step under way at the kill until its exchange failed, the failed attempts
    (`failed_s`: their quorum, compute and failed exchange), the next quorum's request to the
    Lighthouse (`quorum_rpc_s`: its wait for the dead replica's heartbeat to expire), the gloo
    group's reconfigure (`configure_s`), what else the quorum took, and the step itself."""
    record = first_without(run, kill)
    if record is None or "failed_s" not in record:
        return None
    began = record["time"] - record["step_s"] - record["failed_s"]  # the first failed attempt's start
    quorum_other = record["quorum_s"] - record.get("quorum_rpc_s", 0.0) - record.get("configure_s", 0.0)
    return {"kill_to_failed_attempt_s": round(began - kill["time"], 3), "failed_s": record["failed_s"],
            "quorum_rpc_s": record.get("quorum_rpc_s"), "configure_s": record.get("configure_s"),
            "quorum_other_s": round(quorum_other, 3), "step_s": round(record["step_s"] - record["quorum_s"], 3)}


if __name__ == "__main__":
    sys.exit(main())
