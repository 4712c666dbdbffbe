"""Staging a dataset: fatpipe's push (once over the uplink, then a chain over the private links)
against the ideal D/uplink + D/link and the star (one rsync per node from the operator, in
parallel), side by side; a second push with nothing changed against `fatpipe status`.

Deploys one throw-away sim cluster (netns isolation, sshd per node, private links shaped to
`--link-gbit`; needs root, terraform, sshd and rsync) and shapes the operator's side of the
bridge to `--uplink-mbit` (a tbf on the bridge device: the operator's traffic enters the bridge
there). Smaller clusters are the first N nodes of it (an outputs file naming them). For each
size D of random shards and each N, from empty nodes: `fatpipe data push` (timed; the operator's
hashes are warm, as they are after its first push), again with nothing changed, `fatpipe status`
(both with warm ssh masters; every ssh the CLI starts is counted by an `ssh` ahead of the real one
on PATH), then the star. The nodes run fatpipe's node programs with their system python3 (no
--remote-python: what a fresh node has). Node-side memory is polled from /proc (VmHWM of the
largest process in each namespace: the chain's program). Prints the table and each goal met or
not; writes bench/out/stage.json.

    sudo .venv/bin/python bench/stage.py [--quick] [--sizes 256,1024] [--nodes 2,8] [--uplink-mbit 200] [--no-star]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from stage_report import MIB, goals, table  # beside this script: python puts bench/ on the path

CLUSTER, CIDR = "stgbench", "10.151.0.0/24"
SHARD_MIB = 64


def counting_ssh(folder: Path) -> Path:
    """A folder holding `ssh` that logs one line per call, then runs the real ssh."""
    tools = folder / "tools"
    tools.mkdir(exist_ok=True)
    real = shutil.which("ssh")
    (tools / "ssh").write_text(f'#!/bin/sh\necho call >> {tools}/ssh-calls\nexec {real} "$@"\n')
    (tools / "ssh").chmod(0o755)
    return tools


def ssh_calls(root: Path) -> int:
    """ssh calls since the last ask (the count starts again)."""
    log = root / "tools" / "ssh-calls"
    if not log.exists():
        return 0
    calls = len(log.read_text().splitlines())
    log.unlink()
    return calls


def fatpipe(folder: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{folder / 'tools'}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("FATPIPE_CONFIG", None)
    started, lines = time.monotonic(), []
    with subprocess.Popen([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        for line in proc.stdout:  # each line stamped with when it came: where a push spends its time
            lines.append(f"[{time.monotonic() - started:7.2f} s] {line}")
        proc.wait(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines))


def checked(done: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stdout[-4000:]}")
    return done


def make_shards(folder: Path, size_mib: int) -> None:
    """`size_mib` of random bytes in shards of SHARD_MIB, written a MiB at a time."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(-(-size_mib // SHARD_MIB)):
        with open(folder / f"shard_{i:04d}.bin", "wb") as f:
            for _ in range(min(SHARD_MIB, size_mib - i * SHARD_MIB)):
                f.write(os.urandom(MIB))


class MemoryPoll:
    """Peak memory of each node's processes (those in its network namespace), from /proc."""

    def __init__(self, namespaces: list[str], every_s: float = 0.25):
        self.ns_ino = {os.stat(f"/run/netns/{ns}").st_ino: i for i, ns in enumerate(namespaces)}
        self.every_s, self.stop = every_s, threading.Event()
        self.peak_sum = [0] * len(namespaces)  # kB: VmRSS summed over the node's processes
        self.peak_anon = [0] * len(namespaces)  # kB: RssAnon summed (not torch's shared library pages)
        self.peak_proc = [(0, "")] * len(namespaces)  # kB, name: the largest VmHWM of one process
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        self.thread.join()

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            sums, anon = [0] * len(self.peak_sum), [0] * len(self.peak_sum)
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    node = self.ns_ino.get(os.stat(f"/proc/{pid}/ns/net").st_ino)
                    if node is None:
                        continue
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                fields = dict(re.findall(r"^(Name|VmRSS|VmHWM|RssAnon):\s+(\S+)", status, re.M))
                sums[node] += int(fields.get("VmRSS", 0))
                anon[node] += int(fields.get("RssAnon", 0))
                if int(fields.get("VmHWM", 0)) > self.peak_proc[node][0]:
                    self.peak_proc[node] = (int(fields["VmHWM"]), fields.get("Name", "?"))
            self.peak_sum = [max(a, b) for a, b in zip(self.peak_sum, sums, strict=True)]
            self.peak_anon = [max(a, b) for a, b in zip(self.peak_anon, anon, strict=True)]


def star(root: Path, outputs_file: Path, source: Path) -> float:
    """The anchor's way: one rsync over ssh per node from the operator, all at once."""
    from fatpipe.infra.project import load_project
    from fatpipe.infra.runs import load_outputs
    from fatpipe.ops.data.check import node_workdir
    from fatpipe.ops.reach.transport import fan_out, transports_for

    project = load_project(root / "fatpipe.toml")
    outputs = load_outputs(project, CLUSTER, outputs_file)
    pairs = list(zip(outputs.nodes, transports_for(outputs, project.state_dir(CLUSTER)), strict=True))

    def one(pair) -> None:
        node, t = pair
        dest = f"{node_workdir(outputs, node)}/data/set"
        done = t.run(f"mkdir -p -- {shlex.quote(dest)}", timeout=60)
        done = done if not done.ok else t.copy_to(f"{source}/", f"{dest}/", ["--no-z"], timeout=3600)
        if not done.ok:
            raise RuntimeError(f"star to {node.name}: {done.reason()}")

    started = time.monotonic()
    fan_out(one, pairs)
    return time.monotonic() - started


def warm_operator_hashes(root: Path) -> None:
    """The manifest and the operator's hash cache, as a first push leaves them: pushes time the staging."""
    from fatpipe.infra.project import load_project
    from fatpipe.ops.data.stage import make_manifest
    from fatpipe.ops.reach.cluster import Cluster

    make_manifest(Cluster.resolve(load_project(root / "fatpipe.toml"), CLUSTER))


def clear_nodes(node_dirs: list[Path]) -> None:
    for d in node_dirs:
        shutil.rmtree(d / "data", ignore_errors=True)


def one_case(root: Path, size_mib: int, n: int, node_dirs: list[Path], namespaces: list[str], logs: Path,
             with_star: bool = True) -> dict:
    outputs = json.loads((root / ".fatpipe" / CLUSTER / "outputs.json").read_text())
    outputs_file = root / f"outputs-{n}.json"
    outputs_file.write_text(json.dumps({**outputs, "nodes": outputs["nodes"][:n]}))
    push = ["data", "push", CLUSTER, "--outputs", str(outputs_file)]
    clear_nodes(node_dirs[:n])
    with MemoryPoll(namespaces[:n]) as memory:
        started = time.monotonic()
        first = checked(fatpipe(root, *push), "data push")
        push_s = time.monotonic() - started
    uplink = re.search(r"uplink ([\d.]+) s", first.stdout)
    ssh_calls(root)
    started = time.monotonic()
    again = checked(fatpipe(root, *push), "second data push")
    again_s = time.monotonic() - started
    again_calls = ssh_calls(root)
    started = time.monotonic()
    checked(fatpipe(root, "status", CLUSTER), "status")  # the whole cluster: judged where n is all of it
    status_s = time.monotonic() - started
    status_calls = ssh_calls(root) * n / len(outputs["nodes"])
    (logs / f"{size_mib}mib-{n}nodes-push.log").write_text(first.stdout)
    (logs / f"{size_mib}mib-{n}nodes-again.log").write_text(again.stdout)
    if "nothing to fan out" not in again.stdout:
        raise RuntimeError(f"the second push moved data:\n{again.stdout[-2000:]}")
    clear_nodes(node_dirs[:n])
    star_s = star(root, outputs_file, root / "data" / "set") if with_star else float("nan")
    clear_nodes(node_dirs[:n])
    return {"size_mib": size_mib, "nodes": n, "push_s": push_s, "uplink_s": float(uplink[1]) if uplink else None,
            "repush_s": again_s, "repush_ssh_per_node": again_calls / n, "status_s": status_s,
            "status_ssh_per_node": status_calls / n, "star_s": star_s, "peak_node_rss_mb": max(memory.peak_sum) / 1024,
            "peak_node_anon_mb": max(memory.peak_anon) / 1024,
            "peak_process_hwm_mb": max(p[0] for p in memory.peak_proc) / 1024,
            "peak_process": max(memory.peak_proc)[1]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="256,1024", help="dataset sizes in MiB, comma-separated")
    p.add_argument("--nodes", default="2,8", help="node counts, comma-separated")
    p.add_argument("--quick", action="store_true", help="64 MiB on 2 and 8 nodes: a few minutes")
    p.add_argument("--no-star", action="store_true", help="skip the star (one rsync per node): the push alone")
    p.add_argument("--uplink-mbit", type=float, default=200.0)
    p.add_argument("--link-gbit", type=float, default=1.0)
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.nodes = "64", "2,8"
    sizes, counts = [int(s) for s in args.sizes.split(",")], sorted(int(n) for n in args.nodes.split(","))
    if os.geteuid() != 0 or not shutil.which("terraform") or not shutil.which("rsync"):
        print("needs root (network namespaces, tc), terraform and rsync on PATH")
        return 0
    from fatpipe.stacks.sim.links import run, tbf_args
    from fatpipe.stacks.sim.net import link_names

    root = Path(tempfile.mkdtemp(prefix="fatpipe-stage-bench-"))
    os.environ.setdefault("FATPIPE_SSH_CONTROL_DIR", tempfile.mkdtemp(prefix="fp-cm-sb-"))
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = {max(counts)}\ntier = "1g"\nisolation = "netns"\n'
        f'transport = "ssh"\nprivate_cidr = "{CIDR}"\nrdzv_port = 29651\nlink_gbps = {args.link_gbit}\n\n'
        '[data]\nsource = "data/set"\n')
    counting_ssh(root)
    rows: list[dict] = []
    logs = Path(args.out) / "stage-logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        checked(fatpipe(root, "deploy", CLUSTER, "--yes"), "deploy")
        names = [link_names(CLUSTER, i) for i in range(max(counts))]
        run(["tc", "qdisc", "replace", "dev", names[0]["bridge"], "root", *tbf_args(args.uplink_mbit / 1e3)])
        outputs = json.loads((root / ".fatpipe" / CLUSTER / "outputs.json").read_text())
        node_dirs = [Path(node["remote_dir"]) for node in outputs["nodes"]]
        for size in sizes:
            make_shards(root / "data" / "set", size)
            time.sleep(1.5)  # past the hash cache's racy window, then warm the operator's hashes
            warm_operator_hashes(root)
            for n in counts:
                rows.append(one_case(root, size, n, node_dirs, [x["netns"] for x in names], logs, not args.no_star))
                r = rows[-1]
                r["load_after"] = os.getloadavg()[0]
                write_report(Path(args.out), args, rows, [])
                print(f"{size:>5} MiB {n} nodes: push {r['push_s']:6.1f} s (uplink {r['uplink_s']} s), again "
                      f"{r['repush_s']:4.1f} s ({r['repush_ssh_per_node']:g} ssh/node), status {r['status_s']:4.1f} s "
                      f"({r['status_ssh_per_node']:g} ssh/node), star {r['star_s']:6.1f} s, "
                      f"ratio {r['star_s'] / r['push_s']:.2f}, node memory {r['peak_node_anon_mb']:.0f} MB private, "
                      f"{r['peak_node_rss_mb']:.0f} MB resident (one process {r['peak_process_hwm_mb']:.0f} "
                      f"MB, {r['peak_process']}), load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave the cluster up
        fatpipe(root, "down", CLUSTER)
        shutil.rmtree(root, ignore_errors=True)
    verdicts = goals(rows, args.uplink_mbit, args.link_gbit) if rows else []
    if rows:
        print(table(rows, args.uplink_mbit, args.link_gbit))
    print("\n".join(verdicts))
    print(f"wrote {write_report(Path(args.out), args, rows, verdicts)}")
    return 0


def write_report(out: Path, args, rows: list[dict], verdicts: list[str]) -> Path:
    """The JSON report; written after every case too, so a run cut short keeps what it measured."""
    import torch

    report = {"bench": "stage", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                       "torch": torch.__version__},
              "uplink_mbit": args.uplink_mbit, "link_gbit": args.link_gbit, "rows": rows, "goals": verdicts}
    (out / "stage.json").write_text(json.dumps(report, indent=2) + "\n")
    return out / "stage.json"


if __name__ == "__main__":
    sys.exit(main())
