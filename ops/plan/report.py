"""A run's report: one self-contained HTML page (and its PNGs) drawn from the run folder.

Loss against step, each step split into compute and exposed communication, the gradient-sync
latency distribution, link use against the tier, the netcheck sweep against the tier and the TCP
ceiling (and the link matrix of `netcheck --pairs`), the comm decision with its numbers, restarts
and failures. Everything comes from files
the run already wrote (metrics.jsonl, summary.json, netcheck.json, up.json); nothing is measured.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from fatpipe.infra.defaults import NETCHECK_FILE, SUMMARY_FILE, UP_REPORT_FILE
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_atomic
from fatpipe.infra.lazy import pyplot
from fatpipe.trainer import metrics as trainer_metrics

from ..net.gate import link_cell, link_matrix
from ..run.summary import read_json

REPORT_FILE = "report.html"
TCP_CEILING = 0.956  # payload share of a 1500-byte frame's wire time: TCP's best at MTU 1500


def read_metrics(run_dir: Path) -> list[dict]:
    """The run's steps in metrics.jsonl, each as recorded last (`trainer.metrics`: a resumed or
    rewound run wrote some again), skipping a line torn by a kill."""
    return trainer_metrics.read_metrics(run_dir / trainer_metrics.METRICS_FILE)


def figure_png(draw) -> bytes:
    """Draw on a fresh figure with `draw(ax)` and return it as PNG bytes."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    try:
        draw(ax)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)


def loss_figure(records: list[dict]):
    def draw(ax):
        ax.plot([r["step"] for r in records], [r["loss"] for r in records], color="tab:blue")
        ax.set(xlabel="step", ylabel="loss", title="training loss")
    return draw


def step_split_figure(records: list[dict], membership: list[dict] | None = None):
    """Each step's compute and exposed communication; under live fault tolerance a dashed line
    where a node left the quorum (red) or joined it (green)."""
    def draw(ax):
        steps = [r["step"] for r in records]
        exposed = [r.get("exposed_comm_s", 0) * 1e3 for r in records]
        compute = [max(r["step_s"] * 1e3 - e, 0) for r, e in zip(records, exposed, strict=True)]
        ax.bar(steps, compute, label="compute (and hidden comm)", color="tab:green")
        ax.bar(steps, exposed, bottom=compute, label="exposed communication", color="tab:red")
        ax.set(xlabel="step", ylabel="ms", title="step time: compute and exposed communication")
        marked = set()
        for change in membership or []:
            left = change["event"] == "leave"
            label = "node left" if left else "node joined"
            ax.axvline(change["step"], color="tab:red" if left else "tab:olive", linestyle="--",
                       label=None if label in marked else label)
            marked.add(label)
        ax.legend(fontsize=8)
    return draw


def sync_figure(records: list[dict]):
    def draw(ax):
        ax.hist([r["sync_s"] * 1e3 for r in records], bins=min(30, max(5, len(records) // 2)), color="tab:purple")
        ax.set(xlabel="gradient sync latency (ms)", ylabel="steps", title="sync latency distribution")
    return draw


def link_figure(records: list[dict], tier_gbps: float):
    def draw(ax):
        steps = [r["step"] for r in records]
        ax.plot(steps, [r.get("nic_tx_gbps", 0) for r in records], label="NIC tx (rank 0's node)")
        ax.plot(steps, [r.get("nic_rx_gbps", 0) for r in records], label="NIC rx (rank 0's node)")
        ax.plot(steps, [r.get("busbw_gbps", 0) for r in records], label="all-reduce busbw", linestyle=":")
        ax.axhline(tier_gbps, color="green", label=f"tier {tier_gbps:g} Gbit/s")
        ax.set(xlabel="step", ylabel="Gbit/s", title="link use against the tier", ylim=(0, tier_gbps * 1.2))
        ax.legend(fontsize=8)
    return draw


def netcheck_figure(net: dict):
    def draw(ax):
        rows, tier = net["allreduce"], net["tier_gbps"]
        sizes = [r["size"] for r in rows]
        ax.plot(sizes, [r["busbw_gbps"] for r in rows], marker="o", label="busbw")
        ax.axhline(tier, color="green", label=f"tier {tier:g} Gbit/s")
        ax.axhline(tier * TCP_CEILING, color="grey", linestyle="--", label="TCP ceiling at MTU 1500")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="all-reduce size (bytes)", ylabel="Gbit/s", title="netcheck sweep", ylim=(0, tier * 1.2))
        ax.legend(fontsize=8)
    return draw


def table(title: str, rows: dict) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(fmt(v))}</td></tr>" for k, v in rows.items())
    return f"<h2>{html.escape(title)}</h2><table>{cells}</table>"


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return "-" if value is None else str(value)


def pairs_html(pairs: dict) -> str:
    """netcheck --pairs: the n x n link matrix, Gbit/s over round-trip p50 ± jitter, slow links in red."""
    nodes = pairs["nodes"]
    rows = []
    for name, row in zip(nodes, link_matrix(nodes, pairs["links"]), strict=True):
        cells = []
        for link in row:
            if link is None:
                cells.append("<td>-</td>")
                continue
            gbps, latency = link_cell(link)
            style = ' style="color:#c00"' if link["slow"] else ""
            cells.append(f"<td{style}>{gbps}<br>{latency} us</td>")
        rows.append(f"<tr><th>{html.escape(name)}</th>{''.join(cells)}</tr>")
    head = "".join(f"<th>{html.escape(n)}</th>" for n in nodes)
    worst = pairs.get("worst")
    note = "" if not worst else html.escape(
        f"worst link: {worst['a']} <-> {worst['b']}, {worst['best_gbps']:.3f} Gbit/s"
        + (f"; below the bar: {len(pairs['slow'])} link(s)" if pairs["slow"] else "")
        + (f", all touching {pairs['slow_node']}" if pairs.get("slow_node") else ""))
    return (f"<h2>every pair (Gbit/s, round trip p50 ± jitter)</h2><table><tr><th></th>{head}</tr>"
            f"{''.join(rows)}</table><p>{note}</p>")


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fatpipe run {run}</title>
<style>
body {{ font-family: sans-serif; max-width: 60rem; margin: 2rem auto; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1rem; }}
th, td {{ border: 1px solid #ccc; padding: 0.2rem 0.6rem; text-align: left; font-size: 0.9rem; }}
img {{ max-width: 100%; display: block; margin: 0.5rem 0 1.5rem; }}
</style></head>
<body data-figures="0" data-expected="{expected}">
<h1>fatpipe run {run}</h1>
{body}
<script>
// Counts the figures the browser decoded: a check (and a person) can see none is broken.
window.addEventListener("load", () => {{
  const drawn = [...document.images].filter(img => img.complete && img.naturalWidth > 0).length;
  document.body.dataset.figures = String(drawn);
}});
</script>
</body></html>
"""


def write_report(run_dir: Path) -> Path:
    """Write report.html and a PNG per figure into `run_dir`; returns the page's path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FatpipeError(f"{run_dir}: no such run folder")
    records = [r for r in read_metrics(run_dir) if "loss" in r and "step_s" in r]
    summary, net, up = (read_json(run_dir / name) for name in (SUMMARY_FILE, NETCHECK_FILE, UP_REPORT_FILE))
    if not records and not net:
        raise FatpipeError(f"{run_dir}: nothing to report yet (no metrics.jsonl or netcheck.json)")
    tier = float(summary.get("tier_gbps") or net.get("tier_gbps") or (up.get("summary") or {}).get("tier_gbps") or 1)
    figures = []
    if records:
        figures += [("loss", loss_figure(records)),
                    ("step-split", step_split_figure(records, summary.get("membership"))),
                    ("sync-latency", sync_figure(records)), ("link-use", link_figure(records, tier))]
    if net.get("allreduce"):
        figures.append(("netcheck", netcheck_figure(net)))
    parts = []
    for name, draw in figures:
        png = figure_png(draw)
        write_atomic(run_dir / f"report-{name}.png", png)
        parts.append(f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    keys = ("steps", "final_loss", "tokens_per_s", "step_s_p50", "step_s_p95", "sync_s_p50", "sync_s_p95",
            "busbw_gbps", "world_size", "comm")
    parts.append(table("summary", {k: summary.get(k) for k in keys if k in summary}))
    if summary.get("comm_decision"):
        parts.append(table("comm decision", summary["comm_decision"]))
    faults = ("restarts", "failed_collectives", "collectives_attempted", "sync_failure_rate")
    parts.append(table("restarts and failures", {k: summary.get(k) for k in faults}))
    if summary.get("fault_tolerance") == "live":
        live = ("nodes", "membership", "goodput", "skipped_batches", "uncommitted_steps",
                "sync_exchanges", "failed_exchanges", "record")
        parts.append(table("live fault tolerance", {k: summary[k] for k in live if k in summary}))
    if net:
        gate = net.get("gate", {})
        parts.append(table("netcheck", {"busbw_gbps": net.get("busbw_gbps"), "passed": gate.get("passed"),
                                        "reasons": gate.get("reasons")}))
    if net.get("pairs"):
        parts.append(pairs_html(net["pairs"]))
    page = PAGE.format(run=html.escape(run_dir.name), expected=len(figures), body="\n".join(parts))
    return write_atomic(run_dir / REPORT_FILE, page)
