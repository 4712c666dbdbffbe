"""A run on ssh nodes as it stands: the leader's last step, loss, summary and state, read over
the transport in one bounded step of the node program (ops/reach/asknode.py).

A run started with `--detach` on ssh nodes writes everything in the run folder on its nodes; the
folder here stays empty until a followed launch or `fatpipe logs -f` pulls it. `status` and
`runs` ask the node torch made group rank 0 (ops.run.leader), where rank 0 writes metrics.jsonl and
summary.json, as `fatpipe top` does (ops.run.top): read-only, the tail only, with a timeout. The
same command reads that node's record of its group rank: when it is not 0 (torch ranked the nodes
otherwise than planned), the others are asked at once. Nothing here touches the training processes.
"""

from __future__ import annotations

import json
from pathlib import Path

from fatpipe.infra.defaults import GROUP_RANK_FILE, SUMMARY_FILE
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runinfo import RunInfo
from fatpipe.node import source_file
from fatpipe.trainer.live.runplan import node_run_dir  # torch-free

from ..rdzv.noderun import RUNPROC_SOURCE, NodeRun, run_nodes
from ..reach.asknode import NodeCallError, Step, answer_of
from ..reach.cluster import Cluster
from ..reach.transport import fan_out
from .leader import leader
from .top import last_lines

METRICS_FILE = "metrics.jsonl"
TAIL_BYTES = 64 * 1024  # enough of metrics.jsonl's end for its last record
READ_TIMEOUT_S = 15
_SEP = "\n--fatpipe-progress--\n"
NODE_PROGRESS = source_file("runprogress")


def parse_progress(stdout: str) -> dict | None:
    """The text `progress_step` answers (node/runprogress.py): {last_step, final_loss, summary, state, group_rank}; None
    if
    unreadable."""
    parts = stdout.split(_SEP)
    if len(parts) != 4:
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
    grank = parts[3].strip()
    return {"last_step": step, "final_loss": loss, "summary": summary, "state": parts[2].strip(),
            "group_rank": int(grank) if grank.isdigit() else None}


def progress_step(node: NodeRun) -> Step:
    """The node program's step that reads the run's progress on the node (node/runprogress.py):
    under live, the node's own record (`live-node-<k>/` for node k)."""
    folder = node.rdzv.run_rel
    files = node.status_step().args
    record = node_run_dir(Path(folder), node.plan.rank).as_posix() if node.rdzv.live else folder
    return Step("runprogress.progress_text",
                (_SEP, f"{record}/{METRICS_FILE}", TAIL_BYTES, f"{record}/{SUMMARY_FILE}",
                 f"{folder}/{GROUP_RANK_FILE.format(index=node.plan.rank)}", *files),
                node.plan.workdir, (*RUNPROC_SOURCE, ("runprogress", NODE_PROGRESS)))


def read_progress(node: NodeRun) -> dict | None:
    """The node's progress (brought by status's first call, or asked), or None when it does not
    answer in time (the caller keeps the folder's)."""
    try:
        answer = answer_of(node.transport, progress_step(node), timeout=READ_TIMEOUT_S)
    except NodeCallError:
        return None
    return parse_progress(answer["ok"]) if "error" not in answer else None


def leader_progress(nodes: list[NodeRun], first: NodeRun) -> tuple[NodeRun, dict | None]:
    """(the leader, its progress): `first` (the planned leader) unless it recorded another group
    rank, then the node among the others that recorded 0. Under live, where `first` does not
    answer (the node the run went on without), the lowest node that does."""
    found = read_progress(first)
    if found is None and first.rdzv.live:
        for node in (n for n in nodes if n is not first):
            if (theirs := read_progress(node)) is not None:
                return node, theirs
    if not found or found["group_rank"] in (None, 0):
        return first, found
    others = [n for n in nodes if n is not first]
    for node, theirs in zip(others, fan_out(read_progress, others), strict=True):
        if theirs and theirs["group_rank"] == 0:
            return node, theirs
    return first, found


def with_live_progress(info: RunInfo, nodes: list[NodeRun]) -> dict | None:
    """Fill `info` from the leader when the run lives on ssh nodes and its folder here has no
    exits (nothing was pulled yet); returns what the leader said, or None when it was not asked."""
    if info.exits or not nodes or nodes[0].transport.shares_fs:
        return None
    node, found = leader_progress(nodes, leader(nodes, info.path))
    if not found:
        return None
    if found["last_step"] is not None:
        info.last_step, info.final_loss = found["last_step"], found["final_loss"]
    state = found["state"]
    if state == "running":
        info.running = True
    elif state.lstrip("-").isdigit():
        info.exits[f"node-{node.plan.rank}"] = int(state)
    return found


def with_live_latest(cluster: Cluster, runs: list[RunInfo]) -> None:
    """`fatpipe runs`: the latest run, when deployed on ssh nodes and nothing was pulled, as its
    leader has it (one bounded read; an undeployed cluster is not asked)."""
    latest = next((r for r in runs if r.latest), None)
    if latest is None or latest.exits or latest.kind != "train" \
            or not cluster.outputs_path.exists():
        return
    try:
        _, _, nodes = run_nodes(cluster, latest.id)
    except FatpipeError:
        return
    with_live_progress(latest, nodes)
