"""Show a netcheck result: rich tables for the terminal and a PNG of busbw against message size."""

from __future__ import annotations

from pathlib import Path

from .netgate import fmt_size


def render_tables(doc: dict, console) -> None:
    """The sweep in nccl-tests' columns, the p2p pairs, the latency and the verdict."""
    from rich import box
    from rich.table import Table

    threshold = doc["gate"]["threshold_gbps"]
    last = doc["allreduce"][-1]
    sweep = Table(title=f"all-reduce (float32 sum, {doc['backend']}), {doc['world_size']} ranks on "
                        f"{doc['nnodes']} nodes, tier {doc['tier_gbps']:g} Gbit/s", box=box.SIMPLE_HEAD,
                  show_edge=False)
    for name in ("size", "count", "iters", "time (us)", "algbw GB/s", "busbw GB/s", "busbw Gbps"):
        sweep.add_column(name, justify="right", no_wrap=True)
    for r in doc["allreduce"]:
        slow = r is last and doc["nnodes"] > 1 and r["busbw_gbps"] < threshold
        sweep.add_row(fmt_size(r["size"]), str(r["count"]), str(r["iters"]), f"{r['time_s'] * 1e6:.0f}",
                      f"{r['algbw_gbs']:.3f}", f"{r['busbw_gbs']:.3f}", f"{r['busbw_gbps']:.3f}",
                      style="red" if slow else None)
    console.print(sweep)
    p2p = doc.get("p2p")
    if p2p and p2p["pairs"]:
        counts = p2p["streams"]
        pairs = Table(title=f"p2p TCP to {p2p['server']} ({p2p['tool']}, {p2p['seconds']:g} s each)",
                      box=box.SIMPLE_HEAD)
        pairs.add_column("node")
        for n in counts:
            pairs.add_column(f"{n} stream{'s' if n > 1 else ''} (Gbit/s)", justify="right")
        pairs.add_column("best (Gbit/s)", justify="right")
        for pair in p2p["pairs"]:
            cells = [_gbps_cell(pair["gbps_by_streams"].get(str(n))) for n in counts]
            best = "failed: " + pair["error"] if pair.get("error") else f"{pair['best_gbps']:.3f}"
            slow = pair.get("error") or pair["best_gbps"] < threshold
            pairs.add_row(pair["client"], *cells, best, style="red" if slow else None)
        console.print(pairs)
    console.print(f"small-message all-reduce latency: {doc['latency_s'] * 1e6:.1f} us "
                  f"({doc['latency_bytes']} B, slowest rank)")
    gate = doc["gate"]
    if gate["passed"]:
        console.print(f"[green]netcheck passed[/]: busbw {doc['busbw_gbps']:.2f} Gbit/s at "
                      f"{fmt_size(doc['busbw_size'])}, threshold {threshold:.2f} Gbit/s")
    else:
        head = "[red]netcheck failed[/]" if gate["enforced"] else "[yellow]netcheck below the bar (not enforced)[/]"
        console.print(head + ":")
        for reason in gate["reasons"]:
            console.print(f"  - {reason}", markup=False)


def _gbps_cell(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def plot_busbw(doc: dict, path: Path) -> Path:
    """busbw (Gbit/s) against message size on a log2 axis, with the tier and the gate's bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["allreduce"]
    sizes = [r["size"] for r in rows]
    tier, threshold = doc["tier_gbps"], doc["gate"]["threshold_gbps"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    try:
        ax.plot(sizes, [r["busbw_gbps"] for r in rows], marker="o", label=f"busbw ({doc['backend']})")
        ax.plot(sizes, [r["algbw_gbps"] for r in rows], marker=".", linestyle=":", alpha=0.6, label="algbw")
        ax.axhline(tier, color="green", linestyle="-", label=f"tier {tier:g} Gbit/s")
        ax.axhline(threshold, color="red", linestyle="--",
                   label=f"gate {doc['min_fraction']:.2f} x tier = {threshold:.2f} Gbit/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([fmt_size(s).replace(" ", "").replace("iB", "") for s in sizes])
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bandwidth (Gbit/s)")
        ax.set_ylim(0, max([tier * 1.15] + [r["busbw_gbps"] * 1.1 for r in rows]))
        verdict = "passed" if doc["gate"]["passed"] else "FAILED"
        ax.set_title(f"{doc['cluster']}: all-reduce, {doc['world_size']} ranks on {doc['nnodes']} nodes "
                     f"(gate {verdict})", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
