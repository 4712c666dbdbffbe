"""The netcheck plot: a PNG of busbw against message size, with the tier and the gate's bar."""

from __future__ import annotations

import threading
from pathlib import Path

from fatpipe.infra.lazy import pyplot

from .gate import fmt_size


def preload() -> threading.Thread:
    """Import matplotlib in the background (seconds on a busy machine) while the nodes measure,
    so the plot after the benchmark does not wait for it; plot_busbw's own load then finds it."""

    def load() -> None:
        try:
            pyplot()
        except Exception:  # plot_busbw imports it again and reports what is wrong
            pass

    thread = threading.Thread(target=load, name="preload-matplotlib", daemon=True)
    thread.start()
    return thread


def plot_busbw(doc: dict, path: Path) -> Path:
    """busbw (Gbit/s) against message size on a log2 axis, with the tier and the gate's bar."""
    plt = pyplot()
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
