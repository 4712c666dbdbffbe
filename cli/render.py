"""What commands show on the terminal: phase banners and tables, every table, the node log stream.

Only the CLI renders; the layers below return results and print nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fatpipe.ops.net.gate import fmt_size, link_cell, link_matrix
from fatpipe.ops.net.regions import region_lines
from fatpipe.ops.run.liveleave import when_left
from fatpipe.ops.run.nodelines import CLUSTER, NodeLines
from fatpipe.ops.run.summary import failure_text, size_row

PHASES = ("synth", "wheels", "deploy", "wait", "netcheck", "data", "rendezvous", "launch", "summary")


@dataclass
class Phase:
    name: str
    state: str = "not run"  # done | skipped | failed | not run
    seconds: float = 0.0
    note: str = ""


@dataclass
class Phases:
    """Runs the phases in order, shows which one is going, and keeps each one's time and outcome."""

    out: object
    phases: list[Phase] = field(default_factory=lambda: [Phase(name) for name in PHASES])

    def get(self, name: str) -> Phase:
        for phase in self.phases:
            if phase.name == name:
                return phase
        phase = Phase(name)
        self.phases.append(phase)
        return phase

    def header(self, name: str, what: str) -> None:
        step = f"[{PHASES.index(name) + 1}/{len(PHASES)}] " if name in PHASES else ""
        self.out.rule(f"[bold]{step}{name}[/]: {escape(what)}", align="left")

    def run(self, name: str, what: str, fn, spinner: bool = True):
        phase = self.get(name)
        self.header(name, what)
        started = time.monotonic()
        try:
            if spinner:
                with self.out.status(f"{name}: {what}"):
                    value = fn()
            else:
                value = fn()
        except BaseException as e:
            phase.state, phase.note = "failed", str(e).splitlines()[0] if str(e) else type(e).__name__
            raise
        finally:
            phase.seconds = time.monotonic() - started
        if phase.state == "not run":
            phase.state = "done"
        return value

    def skip(self, name: str, why: str) -> None:
        phase = self.get(name)
        phase.state, phase.note = "skipped", why
        self.out.print(f"[skip] {name}: {why}", style="dim", markup=False, highlight=False)

    def table(self):
        table = Table(title="time per phase", title_justify="left")
        table.add_column("phase")
        table.add_column("state")
        table.add_column("seconds", justify="right")
        table.add_column("note")
        style = {"done": "green", "skipped": "dim", "failed": "red", "not run": "dim"}
        for p in self.phases:  # a note quotes keys and errors ("[data]", gloo's "[/pytorch/..]")
            table.add_row(p.name, f"[{style[p.state]}]{p.state}[/]", f"{p.seconds:.1f}", Text(p.note))
        table.add_row("total", "", f"{sum(p.seconds for p in self.phases):.1f}", "")
        return table


COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red")


def log_sink(out, names: list[str], live: bool = False, verbose: bool = False) -> NodeLines:
    """Print the nodes' log lines that the terminal shows (ops.run.nodelines: `verbose`, every
    line) prefixed with the node's name, one color per node; call its flush() at the end."""
    width = max(len(n) for n in [*names, CLUSTER])
    styles = {name: COLORS[i % len(COLORS)] for i, name in enumerate(names)} | {CLUSTER: "bold"}

    def show(node: str, line: str) -> None:
        out.print(Text.assemble((f"{node:<{width}} | ", styles.get(node, "")), line), soft_wrap=True)

    return NodeLines(show, names, live, verbose)


def note(out):
    return lambda message: out.print(message, style="dim", markup=False, highlight=False)


def fetch_lines(log, every_s: float = 5.0):
    """A node_progress callback for a remote [data] fetch that logs one line per node every `every_s`."""
    began: dict[str, float] = {}
    said: dict[str, float] = {}

    def progress(node: str, held: int, total: int, fetched: int) -> None:
        now = time.monotonic()
        began.setdefault(node, now)
        if held < total and now - said.get(node, 0.0) < every_s:
            return
        said[node] = now
        rate = fetched * 8 / max(now - began[node], 1e-3) / 1e6
        log(f"{node}: {held} of {total} bytes held, fetching at {rate:.1f} Mbit/s")
    return progress


def exit_table(result):
    table = Table(title="exit status", title_justify="left")
    table.add_column("node")
    table.add_column("exit", justify="right")
    for name, code in result.exit_codes.items():
        shown = "lost" if code is None else str(code)
        table.add_row(name, f"[green]{shown}[/]" if code == 0 else f"[red]{shown}[/]")
    for name, state in result.unknown.items():  # the follow gave up: not an end
        table.add_row(name, f"[yellow]{state}[/]")
    return table


def readiness_table(states, title: str):
    table = Table(title=title, title_justify="left")
    for column in ("node", "transport", "reachable", "booted", "sysctls", "iface", "mtu", "state"):
        table.add_column(column)

    def mark(ok: bool, known: bool = True) -> str:
        return "[green]yes[/]" if ok else ("[red]no[/]" if known else "-")

    for s in states:
        sysctls = f"[green]{s.checked} ok[/]" if s.sysctls_ok else mark(False, s.booted)
        table.add_row(s.name, s.transport, mark(s.reachable), mark(s.booted, s.reachable), sysctls,
                      s.iface or "-", str(s.mtu or "-"),
                      "[green]ready[/]" if s.ready else f"[yellow]{s.reason}[/]")
    return table


def summary_table(doc: dict):
    def num(value, fmt: str, unit: str = "") -> str:
        return "-" if value is None else format(value, fmt) + unit

    def ms(value) -> str:
        return num(None if value is None else value * 1e3, ".1f", " ms")

    def bw(value) -> str:
        if value is None:
            return "-"
        return f"{value:.2f} Gbit/s ({100 * value / doc['tier_gbps']:.0f}% of the {doc['tier_gbps']:g} Gbit/s tier)"

    table = Table(title="summary", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    rows = [
        ("final loss", num(doc["final_loss"], ".4f")),
        ("eval loss (held out)", num(doc.get("eval_loss"), ".4f")),
        ("steps", num(doc["steps"], "d")),
        ("tokens/s", num(doc["tokens_per_s"], ",.0f")),
        ("step time p50 / p95", f"{ms(doc['step_s_p50'])} / {ms(doc['step_s_p95'])}"),
        ("sync latency p50 / p95", f"{ms(doc['sync_s_p50'])} / {ms(doc['sync_s_p95'])}"),
        ("busbw in training", bw(doc["train_busbw_gbps"])),
        ("busbw in netcheck", bw(doc["netcheck_busbw_gbps"])),
        ("comm hook", str(doc["comm"] or "-")),
        size_row(doc),  # under live: the replica groups, the leaves and joins
        ("sync failure rate", failure_text(doc)),
    ]
    if doc.get("nonfinite_chunks_dropped"):
        rows.append(("dropped between regions", f"{doc['nonfinite_chunks_dropped']} int8 chunk(s) not finite: "
                                                "the outer step skipped them on every region"))
    rows += [("left the run", f"{name} {when_left(leave)}") for name, leave in (doc.get("left") or {}).items()]
    for row in rows:
        table.add_row(*row)
    return table


def netcheck_tables(doc: dict, console) -> None:
    """The sweep in nccl-tests' columns, the p2p pairs, the latency and the verdict."""
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
        if p2p.get("single_flow_gbps") is not None:
            console.print(f"slowest pair: {p2p['single_flow_gbps']:.3f} Gbit/s on one flow (what gloo gets per "
                          f"peer), {p2p['multi_flow_gbps']:.3f} on {max(counts)} (what NCCL can spread over)")
    if doc.get("pairs"):
        pairs_matrix(doc["pairs"], doc["tier_gbps"], console)
    for line, warning in region_lines(doc):
        console.print(line, style="yellow" if warning else None, markup=False)
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
    for note in gate.get("notes", []):
        console.print(f"reported: {note}", markup=False)


def pairs_matrix(pairs: dict, tier_gbps: float, console) -> None:
    """`netcheck --pairs`: every pair's Gbit/s over its round-trip p50 and jitter, n x n; links
    below the bar in red, the worst in bold, then the worst link and the slow ones by name."""
    worst = pairs["worst"] or {}
    table = Table(title=f"every pair: Gbit/s (best of {', '.join(map(str, pairs['streams']))} streams, "
                        f"{pairs['tool']}), round trip p50 ± jitter in us", box=box.SIMPLE_HEAD)
    table.add_column("")
    for name in pairs["nodes"]:
        table.add_column(name, justify="right")
    for name, row in zip(pairs["nodes"], link_matrix(pairs["nodes"], pairs["links"]), strict=True):
        cells = []
        for link in row:
            if link is None:
                cells.append("[dim]-[/]")
                continue
            text = "\n".join(link_cell(link))
            is_worst = (link["a"], link["b"]) == (worst.get("a"), worst.get("b"))
            style = ("bold " if is_worst else "") + ("red" if link["slow"] else "")
            cells.append(f"[{style.strip()}]{text}[/]" if style else text)
        table.add_row(name, *cells)
    console.print(table)
    if worst:
        share = f"{100 * worst['best_gbps'] / tier_gbps:.0f}% of the {tier_gbps:g} Gbit/s tier"
        console.print(f"worst link: {worst['a']} <-> {worst['b']}, "
                      + (f"failed: {worst['error']}" if worst["error"] else
                         f"{worst['best_gbps']:.3f} Gbit/s ({share})"), markup=False)
    if pairs["slow"]:
        names = ", ".join(f"{a} <-> {b}" for a, b in pairs["slow"])
        touch = f" (all touch {pairs['slow_node']})" if pairs.get("slow_node") else ""
        console.print(f"links below the bar: {names}{touch}", style="red", markup=False)


def _gbps_cell(value) -> str:
    return "-" if value is None else f"{value:.3f}"
