"""`fatpipe netcheck`: run the network benchmark on every node, judge it, write netcheck.json and a plot.

The full benchmark (`fatpipe.trainer.net.bench`: all-reduce sweep, p2p TCP, latency; with
`--pairs` every node pair) runs as one torchrun job through the launch path, so it crosses the
same rendezvous, interfaces, backend and links as training will. The quick check (`--quick`, and
`up`'s default) needs none of that: a standard-library program on every node measures the links
over plain sockets (`quick`). Logs go to `<run>/netcheck/`; the verdict goes to
`<run>/netcheck.json` (read by the trainer's comm=auto) and `<run>/netcheck.png`.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from fatpipe.infra.defaults import BENCH_MAX_RESTARTS, NETCHECK_FILE, NETCHECK_PLOT
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_json_atomic
from fatpipe.infra.runs import new_run_id

from ..rdzv.noderun import node_runs
from ..rdzv.rendezvous import RunOptions, new_rendezvous
from ..reach.cluster import Cluster
from ..reach.firewall_check import require_firewall
from ..run.checks import ask_launch_checks, latest_nodes
from ..run.guard import refuse_if_running
from ..run.launch import Follow, launch, run_id_of
from .gate import (
    Bars,
    PairResult,
    evaluate_gate,
    links_from_bench,
    shared_node,
    worst_link,
)
from .options import NetcheckOptions
from .plot import plot_busbw, preload
from .quick import run_quick
from .regions import judge_regions

RESULT_PREFIX = "NETBENCH_JSON "  # netbench's rank 0 prints its result on one such line

Log = Callable[[str], None]
Sink = Callable[[str, str], None]  # (node name, log line)


class NetcheckFailed(FatpipeError):
    """The gate failed: the message names the slow node or pair and the numbers."""

    def __init__(self, message: str, doc: dict):
        super().__init__(message, exit_code=1)
        self.doc = doc


def run_netcheck(cluster: Cluster, *, run_dir: Path | None = None, options: NetcheckOptions | None = None,
                 sink: Sink | None = None, remote_python: str | None = None) -> dict:
    """Benchmark the cluster's network, write netcheck.json and netcheck.png, return the document.

    `cluster`: the command's (ops/reach/cluster.py), logging the progress lines;
    `run_dir` is the run folder (`fatpipe up` passes its run's; default: a new folder under
    `.fatpipe/<cluster>/runs/`, refused while the cluster's latest run still runs);
    `remote_python` is the interpreter on ssh nodes (as for launch). Raises NetcheckFailed
    (exit 1, carrying the document) when the gate fails and `options.enforce`, after writing
    the files.
    """
    preload()
    options = options or NetcheckOptions()
    outputs = cluster.outputs
    fresh = run_dir is None
    if fresh:  # a run folder of its own, not marked `latest`: that stays the last training run
        run_dir = cluster.runs_dir / new_run_id()
        run_dir.mkdir(parents=True)
    run_dir = Path(run_dir)
    try:
        measure = quick_netbench if options.quick and not options.pairs else launch_netbench
        bench = measure(cluster, run_dir, options, sink, remote_python, refuse_running=fresh)
    except BaseException:
        if fresh and not (run_dir / "netcheck" / "node-0.log").exists():  # refused: no clutter
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    doc = netcheck_doc(bench, outputs, options, run_dir.name)
    write_json_atomic(run_dir / NETCHECK_FILE, doc)
    plot_busbw(doc, run_dir / NETCHECK_PLOT)
    if options.enforce and not doc["gate"]["passed"]:
        raise NetcheckFailed("netcheck failed: " + "; ".join(doc["gate"]["reasons"]), doc)
    return doc


def launch_netbench(cluster: Cluster, run_dir: Path, options: NetcheckOptions, sink: Sink | None = None,
                    remote_python: str | None = None, refuse_running: bool = False) -> dict:
    """Run netbench on every node through the launch path; return rank 0's result.

    One call per node asks what the launch checks, the firewall and (`refuse_running`: a
    netcheck of its own, which would share the links and the CPUs) the latest run's state."""
    project, outputs, log = cluster.project, cluster.outputs, cluster.log
    bench_dir = run_dir / "netcheck"
    bench_dir.mkdir(parents=True, exist_ok=True)
    out_rel = (bench_dir / "netbench.json").resolve().relative_to(project.root.resolve()).as_posix()
    found: list[dict] = []

    def catch(node: str, line: str) -> None:
        # Rank 0 prints its result on one line: read it from the log stream, so the numbers
        # come back from whichever node rank 0 landed on.
        at = line.find(RESULT_PREFIX)
        if at >= 0:
            try:
                found.append(json.loads(line[at + len(RESULT_PREFIX):]))
            except json.JSONDecodeError:
                pass
        elif sink:
            sink(node, line)

    run_options = RunOptions(max_restarts=BENCH_MAX_RESTARTS, remote_python=remote_python)
    rdzv = new_rendezvous(cluster, run_id_of(bench_dir), bench_dir,
                          entry=options.netbench_args(outputs, out_rel), options=run_options)
    nodes = node_runs(rdzv, cluster)  # made once: every stage of the launch takes them
    previous = latest_nodes(cluster) if refuse_running else []
    try:
        ask_launch_checks(cluster, nodes, previous)
        going = refuse_if_running(cluster, previous, force=options.force) if refuse_running else None
        if going:
            log(going)
        for warning in require_firewall(cluster):
            log(f"warning: {warning}")
    except BaseException:
        cluster.answers.forget_all()
        raise
    timeout = options.timeout_s or options.estimate_s(len(outputs.nodes), outputs.tier_gbps)
    log(f"netcheck: {len(outputs.nodes)} nodes at {outputs.tier_gbps:g} Gbit/s, up to {timeout:.0f} s")
    result = launch(cluster, nodes, bench_dir, sink=catch, follow=Follow(timeout))
    if not found and (bench_dir / "netbench.json").exists():
        found.append(json.loads((bench_dir / "netbench.json").read_text()))
    if not result.ok or not found:
        bad = {name: code for name, code in result.exit_codes.items() if code != 0}
        failed = "failed on " + ", ".join(f"{n} (exit {c})" for n, c in bad.items()) if bad else "gave no result"
        why = (f"timed out after {timeout:.0f} s (`netcheck --timeout` or `up --netcheck-timeout` gives it more)"
               if result.timed_out else "interrupted" if result.interrupted else failed)
        logs = _shown(bench_dir, project.root)
        raise FatpipeError(f"netcheck benchmark {why}; node logs in {logs}/node-<rank>.log",
                           exit_code=result.exit_code or 1)
    return found[-1]


def quick_netbench(cluster: Cluster, run_dir: Path, options: NetcheckOptions, sink: Sink | None = None,
                   remote_python: str | None = None, refuse_running: bool = False) -> dict:
    """The quick check without torch (`quick.run_quick`), after the checks a launch would make of
    the nodes: the latest run's state (`refuse_running`) and the firewall."""
    if refuse_running:
        going = refuse_if_running(cluster, latest_nodes(cluster), force=options.force)
        if going:
            cluster.log(going)
    for warning in require_firewall(cluster):
        cluster.log(f"warning: {warning}")
    bench_dir = run_dir / "netcheck"
    bench_dir.mkdir(parents=True, exist_ok=True)
    return run_quick(cluster, bench_dir, options, sink, remote_python)


def pairs_from_bench(p2p: dict | None, names: dict[str, str]) -> list[PairResult]:
    """One PairResult per client node from netbench's p2p results, named by private IP."""
    if not p2p:
        return []
    by_client: dict[str, dict] = {}
    for r in p2p["results"]:
        client = names.get(r["client_ip"]) or r.get("client") or r["client_ip"]
        server = names.get(r["server_ip"]) or r.get("server") or r["server_ip"]
        entry = by_client.setdefault(client, {"server": server, "gbps": {}, "errors": []})
        if r.get("error"):
            entry["errors"].append(f"{r['streams']} stream(s): {r['error']}")
        else:
            entry["gbps"][int(r["streams"])] = float(r["gbps"])
    return [PairResult(server=e["server"], client=client, gbps_by_streams=e["gbps"],
                       error="; ".join(e["errors"]) if e["errors"] and not e["gbps"] else None)
            for client, e in by_client.items()]


def worst_pair(pairs: list[PairResult], pick) -> float | None:
    """The slowest pair's rate at its fewest (pick=min) or most (pick=max) streams."""
    rates = [p.gbps_by_streams[pick(p.gbps_by_streams)] for p in pairs if p.gbps_by_streams]
    return min(rates) if rates else None


def netcheck_doc(bench: dict, outputs, options: NetcheckOptions, run_id: str = "") -> dict:
    """netcheck.json: the sweep, the pairs, the latency and the gate, with the keys comm=auto reads."""
    names = {node.private_ip: node.name for node in outputs.nodes}
    pairs = pairs_from_bench(bench.get("p2p"), names)
    bench_pairs = bench.get("pairs")
    if bench_pairs:  # in the cluster's node order, whatever order the ranks reported them in
        bench_pairs = {**bench_pairs, "links": sorted(bench_pairs["links"], key=lambda r: (r["a_node"], r["b_node"]))}
    links = links_from_bench(bench_pairs, names)
    # Regions: measured from the pairs (when run) and held against the declared ones; the gate
    # holds cross-region pairs to the declared cross-region rate.
    regions, crossing = judge_regions(outputs, links if bench_pairs else None)
    gate = evaluate_gate(outputs.tier_gbps, bench.get("busbw_gbps"), bench.get("busbw_size"), pairs,
                         options.min_fraction, nnodes=bench["nnodes"], links=links, regions=crossing)
    rows = bench["allreduce"]
    p2p = bench.get("p2p")
    return {
        "cluster": outputs.name,
        "run_id": run_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tier_gbps": outputs.tier_gbps,
        "min_fraction": options.min_fraction,
        "backend": bench["backend"],
        "world_size": bench["world_size"],
        "nnodes": bench["nnodes"],
        # What the trainer's comm=auto reads: busbw at the largest size, and the latency.
        "busbw_gbps": rows[-1]["busbw_gbps"],
        "busbw_size": rows[-1]["size"],
        "algbw_gbps": rows[-1]["algbw_gbps"],
        "latency_s": bench["latency_s"],
        "latency_bytes": bench["latency_bytes"],
        "allreduce": rows,
        "p2p": None if not p2p else {
            "tool": p2p["tool"],
            "server": names.get(p2p["server_ip"], p2p["server_ip"]),
            "seconds": p2p["seconds"],
            "streams": p2p["streams"],
            "pairs": [{"server": p.server, "client": p.client, "best_gbps": p.best_gbps,
                       "gbps_by_streams": {str(n): g for n, g in sorted(p.gbps_by_streams.items())},
                       "error": p.error} for p in pairs],
            # gloo opens one TCP flow per peer, NCCL many: a provider that caps a single flow
            # (AWS: 10 Gbit/s) shows here as single-flow well below multi-flow.
            "single_flow_gbps": worst_pair(pairs, min) if 1 in p2p["streams"] else None,
            "multi_flow_gbps": worst_pair(pairs, max),
        },
        "pairs": pairs_doc(bench_pairs, links, names, Bars(outputs.tier_gbps, options.min_fraction, crossing)),
        "regions": regions,
        "gate": {**gate.to_json(), "enforced": options.enforce},
        "bench_elapsed_s": bench.get("elapsed_s"),
    }


def pairs_doc(bench_pairs: dict | None, links: list, names: dict[str, str], bars: Bars) -> dict | None:
    """netcheck.json's `pairs`: every node pair's throughput, latency and jitter, the slow ones
    (below their bar: `bars`) marked, the worst named, and the node every slow link touches (when
    there is one)."""
    if not bench_pairs:
        return None
    slow = [link for link in links if bars.slow(link)]
    worst = worst_link(links)
    return {
        "tool": bench_pairs["tool"],
        "seconds": bench_pairs["seconds"],
        "streams": bench_pairs["streams"],
        "nodes": list(names.values()),
        "rounds": bench_pairs["rounds"],
        "links": [{"a": link.a, "b": link.b, "best_gbps": link.best_gbps,
                   "gbps_by_streams": {str(n): g for n, g in sorted(link.gbps_by_streams.items())},
                   "rtt_p50_s": row.get("rtt_p50_s"), "rtt_p95_s": row.get("rtt_p95_s"),
                   "jitter_s": row.get("jitter_s"), "rtt_count": row.get("rtt_count"),
                   "round": row.get("round"), "error": link.error, "slow": bars.slow(link)}
                  for link, row in zip(links, bench_pairs["links"], strict=True)],
        "worst": None if worst is None else {"a": worst.a, "b": worst.b, "best_gbps": worst.best_gbps,
                                             "error": worst.error},
        "slow": [[link.a, link.b] for link in slow],
        "slow_node": shared_node(slow),
    }


def _shown(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)
