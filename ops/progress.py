"""A run on ssh nodes as it stands: node 0's last step, loss, summary and state, read over the
transport in one bounded command.

A run started with `--detach` on ssh nodes writes everything in the run folder on its nodes; the
folder here stays empty until a followed launch or `fatpipe logs -f` pulls it. `status` and
`runs` ask node 0, where rank 0 writes metrics.jsonl and summary.json, as `fatpipe top` does
(ops.top): read-only, the tail only, with a timeout. Nothing here touches the training processes.
"""

from __future__ import annotations

import json
import shlex

from fatpipe.infra.defaults import SUMMARY_FILE
from fatpipe.infra.runinfo import RunInfo

from .noderun import NodeRun, run_nodes
from .top import last_lines

METRICS_FILE = "metrics.jsonl"
TAIL_BYTES = 64 * 1024  # enough of metrics.jsonl's end for its last record
READ_TIMEOUT_S = 15
_SEP = "\n--fatpipe-progress--\n"


def progress_command(node: NodeRun) -> str:
    """On the node: metrics.jsonl's size and tail, summary.json, and the node's run state."""
    folder = shlex.quote(node.rdzv.run_rel)
    metrics = (f"f={folder}/{METRICS_FILE}; stat -c %s $f 2>/dev/null || echo 0; "
               f"tail -c {TAIL_BYTES} $f 2>/dev/null")
    sep = f"printf {shlex.quote(_SEP)}"
    return (f"({node.sh(metrics)}); {sep}; ({node.sh(f'cat {folder}/{SUMMARY_FILE} 2>/dev/null')}); "
            f"{sep}; ({node.status_command()}); true")


def parse_progress(stdout: str) -> dict | None:
    """`progress_command`'s output: {last_step, final_loss, summary, state}; None if unreadable."""
    parts = stdout.split(_SEP)
    if len(parts) != 3:
        return None
    size, _, tail = parts[0].partition("\n")
    size = int(size) if size.strip().isdigit() else 0
    records = [r for r in last_lines(tail, size > TAIL_BYTES) if "step" in r]
    try:
        summary = json.loads(parts[1]) if parts[1].strip() else None
    except ValueError:
        summary = None
    summary = summary if isinstance(summary, dict) else None
    last = records[-1] if records else {}
    step = summary.get("steps") if summary and isinstance(summary.get("steps"), int) else last.get("step")
    loss = summary.get("final_loss") if summary and "final_loss" in summary else last.get("loss")
    return {"last_step": step, "final_loss": loss, "summary": summary, "state": parts[2].strip()}


def read_progress(node: NodeRun) -> dict | None:
    """Node 0's progress, or None when it does not answer in time (the caller keeps the folder's)."""
    result = node.transport.run(progress_command(node), timeout=READ_TIMEOUT_S)
    return parse_progress(result.stdout) if result.ok else None


def with_live_progress(info: RunInfo, nodes: list[NodeRun]) -> dict | None:
    """Fill `info` from node 0 when the run lives on ssh nodes and its folder here has no exits
    (nothing was pulled yet); returns what node 0 said, or None when it was not asked."""
    if info.exits or not nodes or nodes[0].transport.shares_fs:
        return None
    found = read_progress(nodes[0])
    if not found:
        return None
    if found["last_step"] is not None:
        info.last_step, info.final_loss = found["last_step"], found["final_loss"]
    state = found["state"]
    if state == "running":
        info.running = True
    elif state.lstrip("-").isdigit():
        info.exits[f"node-{nodes[0].plan.rank}"] = int(state)
    return found


def with_live_latest(project, cluster: str, runs: list[RunInfo]) -> None:
    """`fatpipe runs`: the latest run, when deployed on ssh nodes and nothing was pulled, as node 0
    has it (one bounded read; an undeployed cluster is not asked)."""
    from fatpipe.infra.errors import FatpipeError
    from fatpipe.infra.runs import outputs_file

    latest = next((r for r in runs if r.latest), None)
    if latest is None or latest.exits or latest.kind != "train" or not outputs_file(project, cluster).exists():
        return
    try:
        _, _, nodes = run_nodes(project, cluster, latest.id)
    except FatpipeError:
        return
    with_live_progress(latest, nodes)
