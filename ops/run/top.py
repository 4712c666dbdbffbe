"""`fatpipe top`'s data: the latest cluster view and events of a run, read from the rank-0 node.

The trainer's rank 0 appends one cluster view per window to `nodes.jsonl` and its events to
`events.jsonl` (`trainer.nodemetrics`; docs/ARCHITECTURE.md, "The run folder"). This reads
their tails only, read-only and bounded: a local file for sim nodes, one `tail -c` over the
node's transport for ssh and cloud nodes. Nothing here touches the training processes.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from fatpipe.infra.defaults import SUMMARY_FILE
from fatpipe.infra.errors import FatpipeError
from fatpipe.trainer.live.runplan import node_run_dir  # torch-free
from fatpipe.trainer.nodestats import EVENTS_FILE, NODES_FILE  # torch-free

from ..rdzv.noderun import NodeRun, run_nodes
from ..reach.cluster import Cluster
from ..reach.transport import fan_out
from .leader import leader_first

TAIL_BYTES = 256 * 1024  # the last views of a 64-node cluster fit many times over
EVENT_COUNT = 10  # the newest events shown
READ_TIMEOUT_S = 15
# Live: a node whose latest window is this much older than the newest node's is shown gone.
LIVE_GONE_S = 30.0
_SEP = "\n--fatpipe-top--\n"


def last_lines(text: str, cut: bool) -> list[dict]:
    """The complete JSON-object lines of a file's tail; `cut`: the tail began mid-file, so its
    first line is partial. A torn last line (being written) is skipped."""
    lines = text.split("\n")
    if cut:
        lines = lines[1:]
    out = []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def _tail_local(path: Path) -> tuple[str, bool]:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            return f.read().decode(errors="replace"), size > TAIL_BYTES
    except OSError:
        return "", False


def _read_local(run_dir: Path) -> tuple[list[dict], list[dict], bool]:
    nodes, events = _tail_local(run_dir / NODES_FILE), _tail_local(run_dir / EVENTS_FILE)
    return last_lines(*nodes), last_lines(*events), (run_dir / SUMMARY_FILE).exists()


def tail_command(node: NodeRun, folder: str | None = None) -> str:
    """On the node: both files' tails, each preceded by its size, and whether the run finished
    (in the run folder, or `folder` relative to the project folder)."""
    folder = shlex.quote(folder or node.rdzv.run_rel)
    parts = [f"f={folder}/{name}; stat -c %s $f 2>/dev/null || echo 0; tail -c {TAIL_BYTES} $f 2>/dev/null"
             for name in (NODES_FILE, EVENTS_FILE)]
    sep = f"printf {shlex.quote(_SEP)}"
    return node.sh(f"{parts[0]}; {sep}; {parts[1]}; {sep}; [ -e {folder}/{SUMMARY_FILE} ] && echo finished; true")


def parse_tail(stdout: str) -> tuple[list[dict], list[dict], bool] | None:
    """`tail_command`'s output read back; None when the node holds no node metrics."""
    parts = stdout.split(_SEP)
    if len(parts) != 3:
        return None
    found = []
    for part in parts[:2]:
        size, _, text = part.partition("\n")
        size = int(size) if size.strip().isdigit() else 0
        found.append(last_lines(text, size > TAIL_BYTES))
    if not found[0]:
        return None
    return found[0], found[1], parts[2].strip() == "finished"


def _read_remote(nodes: list[NodeRun]) -> tuple[list[dict], list[dict], bool]:
    """Rank 0 writes the files on its node: ask that node first (`nodes` has it first, ops.run.leader),
    then the others at once."""
    def ask(node: NodeRun):
        result = node.transport.run(tail_command(node), timeout=READ_TIMEOUT_S)
        if not result.ok:
            raise FatpipeError(f"{node.transport.describe()}: cannot read the node metrics: {result.reason()}")
        return parse_tail(result.stdout)

    first = ask(nodes[0])
    if first:
        return first
    for found in fan_out(ask, nodes[1:]):
        if found:
            return found
    return [], [], False


def snapshot(cluster: Cluster, run_id: str | None = None) -> dict:
    """The run's latest window as `fatpipe top` shows it: every node, the straggler, events."""
    run_id, run_dir, nodes = run_nodes(cluster, run_id)
    if nodes and nodes[0].rdzv.live:
        return live_snapshot(cluster.name, run_id, run_dir, nodes)
    if not nodes or nodes[0].transport.shares_fs or (run_dir / NODES_FILE).exists():
        views, events, finished = _read_local(run_dir)
    else:
        views, events, finished = _read_remote(leader_first(nodes, run_dir))
    if not views:
        raise no_metrics(run_id)
    return top_view(cluster.name, run_id, (views, events, finished))


def no_metrics(run_id: str) -> FatpipeError:
    return FatpipeError(f"run {run_id} has no node metrics yet (written every node_metrics_every "
                        f"steps by the trainer; 0 turns them off)")


def top_view(cluster: str, run_id: str, read: tuple[list[dict], list[dict], bool]) -> dict:
    """What `fatpipe top` shows from one rank 0's (views, events, finished): its latest window."""
    views, events, finished = read
    view = views[-1]
    return {"cluster": cluster, "run": run_id, "finished": finished,
            "window": {k: view.get(k) for k in ("window", "attempt", "first_step", "last_step", "time")},
            "tier_gbps": view.get("tier_gbps"), "world_size": view.get("world_size"),
            "step_s_p50": view.get("step_s_p50"), "sync_s_p50": view.get("sync_s_p50"),
            "nodes": view.get("nodes", []), "straggler": view.get("straggler"),
            "events": events[-EVENT_COUNT:]}


def live_snapshot(cluster: str, run_id: str, run_dir: Path, nodes: list[NodeRun]) -> dict:
    """Under live fault tolerance each node measures itself into its own folder (node k's
    `live-node-<k>/`): every node's latest window, the ones that stopped reporting marked gone,
    and node 0's events (each join and leave among them)."""
    def read(node: NodeRun):
        rel = node_run_dir(Path(node.rdzv.run_rel), node.plan.rank)
        if node.transport.shares_fs:
            return _read_local(run_dir / rel.relative_to(node.rdzv.run_rel))
        result = node.transport.run(tail_command(node, rel.as_posix()), timeout=READ_TIMEOUT_S)
        return parse_tail(result.stdout) if result.ok else None

    found = fan_out(read, nodes)
    latest = {n.name: f[0][-1] for n, f in zip(nodes, found, strict=True) if f and f[0]}
    if not latest:
        raise no_metrics(run_id)
    newest = max(v.get("time", 0) for v in latest.values())
    rows = []
    for node in nodes:
        view = latest.get(node.name)
        gone = view is None or newest - view.get("time", 0) > LIVE_GONE_S
        own = (view or {}).get("nodes") or [{"node": node.name}]
        rows += [{**row, "node": node.name, "state": "gone" if gone else "up"} for row in own[:1]]
    lead = next(f for f in found if f and f[0])  # node 0's, unless it has none
    return {**top_view(cluster, run_id, lead), "nodes": rows, "straggler": None, "live": True}
