"""`fatpipe top [CLUSTER]`: a live view of the running job per node, from what rank 0 writes."""

from __future__ import annotations

import json
import time

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fatpipe.infra.errors import FatpipeError
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.top import snapshot

from .options import console, pass_project

BAR_WIDTH = 10


@pass_project
def top(project, cluster: str | None, run_id, once: bool, as_json: bool, interval: float):
    """The body of `fatpipe top`; its options and help are declared in run_commands.py."""
    resolved = Cluster.resolve(project, cluster)
    if as_json:
        click.echo(json.dumps(snapshot(resolved, run_id), indent=2))
        return
    out = console()
    if once:
        out.print(render(snapshot(resolved, run_id)))
        return
    view, problem = _fetch(resolved, run_id)
    try:
        with Live(_screen(view, problem), console=out, auto_refresh=False) as live:
            while not (view and view["finished"]):
                time.sleep(interval)
                new, problem = _fetch(resolved, view["run"] if view else run_id)
                view = new or view
                live.update(_screen(view, problem), refresh=True)
    except KeyboardInterrupt:
        return
    out.print(f"run {view['run']} has finished")


def _fetch(cluster: Cluster, run_id: str | None) -> tuple[dict | None, str | None]:
    """(the newest view, None), or (None, why not yet): before the first window, or while a
    node does not answer, the screen says so and keeps trying. A bad --run is an error."""
    try:
        return snapshot(cluster, run_id), None
    except FatpipeError as e:
        if e.exit_code != 1:
            raise
        return None, str(e)


def _screen(view: dict | None, problem: str | None):
    note = Text(f"{problem} (trying again)", style="yellow") if problem else Text("")
    return Group(render(view), note) if view else note


def _bar(share: float | None) -> str:
    if share is None:
        return "-"
    filled = round(min(max(share, 0.0), 1.0) * BAR_WIDTH)
    color = "green" if share >= 0.7 else "yellow" if share >= 0.3 else "red"
    return f"[{color}]{'█' * filled}[/][dim]{'·' * (BAR_WIDTH - filled)}[/] {share:4.0%}"


def _ms(value) -> str:
    return f"{value * 1e3:.0f}" if isinstance(value, (int, float)) else "-"


def render(view: dict):
    """The view as a rich table: one row per node, the straggler marked, events as the caption."""
    w, tier = view["window"], view.get("tier_gbps")
    state = "finished" if view["finished"] else "running"
    title = (f"run {view['run']} on {view['cluster']} ({state}), steps {w.get('first_step')}-"
             f"{w.get('last_step')}, attempt {w.get('attempt')}" + (f", tier {tier:g}" if tier else "")
             + ": rates in Gbit/s, times in ms")
    table = Table(title=title, title_justify="left", caption=_caption(view), caption_justify="left")
    for column in ("node", "tx/rx vs tier", "tx", "rx", "link", "step p50/95", "sync p50/95", "compute", ""):
        table.add_column(column, justify="left" if column in ("node", "tx/rx vs tier", "") else "right",
                         no_wrap=True)
    straggler = view.get("straggler") or {}
    for n in view["nodes"]:
        mark = f"[red]◀ {straggler['kind']}[/]" if n["node"] == straggler.get("node") else ""
        if n.get("state") == "gone":  # live: out of the quorum, its own window stale
            mark = "[red]gone[/]"
        link = f"{n['link_gbps']:.2f}" if n.get("link_gbps") else "-"
        table.add_row(n["node"], _bar(n.get("util")), f"{n.get('tx_gbps', 0):.2f}", f"{n.get('rx_gbps', 0):.2f}", link,
                      f"{_ms(n.get('step_s_p50'))}/{_ms(n.get('step_s_p95'))}",
                      f"{_ms(n.get('sync_s_p50'))}/{_ms(n.get('sync_s_p95'))}", _ms(n.get("compute_s_p50")),
                      mark)
    return table


def _caption(view: dict) -> str:
    straggler = view.get("straggler")
    lines = [f"[red]straggler: {straggler['reason']}[/]" if straggler else "no straggler"]
    for e in view.get("events", [])[-5:]:
        when = time.strftime("%H:%M:%S", time.localtime(e["time"])) if e.get("time") else "?"
        lines.append(f"{when} step {e.get('last_step')}: {e.get('event')}: {e.get('reason')}")
    return "\n".join(lines)
