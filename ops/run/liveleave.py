"""Under live fault tolerance: whether the run went on without a node the follow cannot reach
(docs/ARCHITECTURE.md, "Live fault tolerance").

A node out of reach has either left the run (destroyed, its processes gone, cut off from its
peers too) or trains on behind a link only this machine lost. Its peers tell which: each node
records every step it commits in a folder of its own, with how many replica groups made the
step's mean (`participants`) and whether it was one of them (not `healed`). When the nodes in
reach committed a step after the node went out of reach, and as many of them took part in that
step as it had groups, the node was not in its quorum: the run left it, and its silence is no
reason to stop following. A node that answers again is followed again. The follow
(ops/run/follow.py) asks this of the views it keeps per node (`LogView`).
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from fatpipe.trainer.live.runplan import node_run_dir  # torch-free

from ..rdzv.noderun import NodeRun, ridden_out
from ..reach.transport import fan_out
from .top import last_lines

METRICS_FILE = "metrics.jsonl"
TAIL_BYTES = 256 * 1024  # several hundred steps' records: back to where the groups fell
READ_TIMEOUT_S = 15


def read_records(node: NodeRun) -> list[dict]:
    """The latest step records the node wrote in its own folder, read over its transport
    (oldest first; none when it does not answer or has none)."""
    folder = node_run_dir(Path(node.rdzv.run_rel), node.plan.rank).as_posix()
    path = shlex.quote(f"{folder}/{METRICS_FILE}")
    result = node.transport.run(node.sh(f"stat -c %s {path} && tail -c {TAIL_BYTES} {path}"),
                                timeout=READ_TIMEOUT_S)
    size, _, text = result.stdout.partition("\n")
    if not result.ok or not size.strip().isdigit():
        return []
    return [r for r in last_lines(text, int(size) > TAIL_BYTES) if isinstance(r.get("step"), int)]


def went_on_without(records: list[list[dict]], since: float) -> dict | None:
    """Whether the nodes whose `records` these are (one list per node in reach) went on without
    every other node after `since` (wall time the others went out of reach): {"step": the
    first step of the stretch without them, "time": when it was committed}, or None when their
    records do not show it (none since, or a step with more groups than nodes in reach)."""
    fresh = [recs for recs in records if recs and _number(recs[-1].get("time")) >= since]
    if not fresh:
        return None
    latest = min(fresh, key=lambda recs: recs[-1]["step"])
    step = latest[-1]["step"]  # the newest step every fresh node has committed
    at_step = [next((r for r in reversed(recs) if r["step"] == step), None) for recs in fresh]
    took_part = [r for r in at_step if r is not None and not r.get("healed")]
    groups = latest[-1].get("participants")
    if not isinstance(groups, int) or not took_part or groups > len(took_part):
        return None
    first = latest[-1]  # back through the stretch where the groups stayed as few
    for rec in reversed(latest):
        if not isinstance(rec.get("participants"), int) or rec["participants"] > groups:
            break
        first = rec
    return {"step": first["step"], "time": _number(first.get("time")) or since}


def judge_leaves(in_reach: list[NodeRun], away: dict[str, float]) -> dict[str, dict]:
    """The nodes of `away` ({node: wall time it went out of reach}) that the nodes `in_reach`
    went on without: {node: went_on_without's answer}."""
    records = fan_out(read_records, in_reach) if in_reach and away else []
    left = {name: went_on_without(records, since) for name, since in away.items()}
    return {name: leave for name, leave in left.items() if leave}


def ended_without(views: list, now: float, grace_s: float) -> bool:
    """Live: whether the run ended on the nodes in reach, without the rest: each node has ended
    or left, or a node finished the run and the rest are out of reach past `grace_s`."""
    if not any(v.end for v in views):
        return False
    if all(v.end or v.left for v in views):
        return True
    return any(v.end and v.end.code == 0 for v in views) and all(
        v.end or v.unreachable_since and now - v.unreachable_since > grace_s for v in views)


def mark_leaves(views: list, away: list) -> list:
    """Ask the nodes in reach whether the run went on without those `away`; marks the ones it
    left, returns the others (the follow cannot tell what they are doing)."""
    since = {v.node.name: v.unreachable_at for v in away if v.unreachable_at is not None}
    in_reach = [v.node for v in views if v.unreachable_since is None]
    for name, leave in judge_leaves(in_reach, since).items():
        view = next(v for v in away if v.node.name == name)
        if view.unreachable_since is not None:  # not back meanwhile
            view.left = leave
    return [v for v in away if v.left is None and v.unreachable_since is not None]


def leave_lines(codes: dict[str, int | None], left: dict[str, dict]) -> list[str]:
    """One line per node a live run finished without (`codes`: each node's end, None: lost;
    `left`: when the others went on without those out of reach); none unless a node finished."""
    if 0 not in codes.values():
        return []
    lines = []
    for name, code in codes.items():
        if name in left:
            lines.append(f"{name} left the run {when_left(left[name])}: out of reach, the other "
                         "nodes went on without it and finished it")
        elif ridden_out(code):
            lines.append(f"{name} left the run ({'lost: its end is unknown' if code is None else f'status {code}'}); "
                         "the other nodes finished it")
    return lines


def when_left(leave: dict) -> str:
    """"at step N (HH:MM:SS)": the first step the others committed without the node."""
    return f"at step {leave['step']} ({time.strftime('%H:%M:%S', time.localtime(leave['time']))})"


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0
