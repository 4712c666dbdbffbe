"""A live run's record, whichever node was away (docs/ARCHITECTURE.md, "Live fault tolerance").

Under live every node records the run as it took part in it, in a folder of its own
(`live-node-<k>/`; node 0 keeps a copy of its own there: `trainer.live.runplan.own_record`). A
node that was away holds none of the steps the others committed meanwhile, and node 0 is as
likely as any to be that node. So the run folder's metrics.jsonl and summary.json, the record
`top`, `report`, `runs` and the summary read, are made here from every node's once the run has
ended or its folders were pulled (`keep_headline`). Mirrored and merged rather than kept by the
lowest node that is up: on nodes with disks of their own, the steps one node kept would go with
its disk, while with every node holding its own, any node that stayed holds every step it took.

Each step comes from the lowest node that took part in it (a node sent the live state at that
step, `healed`, only when none did: its loss is of the weights it had before); a record more
than SAME_COMMIT_S older than the newest one of its step belongs to an attempt the run went back
from (every node lost and resumed from checkpoints). The summary is the lowest finished node's,
with what the steps say counted again over the merged steps (the step figures, membership,
goodput, skipped batches, the exchanges that failed) and the replicas in sync only when every
finished node ended with the same parameters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from fatpipe.infra.defaults import SUMMARY_FILE
from fatpipe.infra.files import write_atomic
from fatpipe.trainer.live.membership import run_fields
from fatpipe.trainer.metrics import METRICS_FILE, read_metrics, summarize

from .summary import read_json

NODE_FOLDER = re.compile(r"^live-node-(\d+)$")
# The records of one commit are written within milliseconds on every node; taking a step again
# after every node was lost needs a restart and a quorum, many seconds.
SAME_COMMIT_S = 5.0

View = tuple[list[dict], dict]  # a node's steps (as it recorded them last) and its summary


def node_views(run_dir: Path) -> dict[int, View]:
    """{node index: its record} from the run folder's `live-node-<k>/`; node 0's is the run
    folder's own while it has none there (a run recorded before node 0 kept a copy)."""
    run_dir = Path(run_dir)
    views: dict[int, View] = {}
    for folder in run_dir.glob("live-node-*"):
        found = NODE_FOLDER.match(folder.name)
        if found and folder.is_dir():
            views[int(found[1])] = (read_metrics(folder / METRICS_FILE),
                                    read_json(folder / SUMMARY_FILE))
    if views and 0 not in views:  # what a merge here wrote is no node's own
        own = [r for r in read_metrics(run_dir / METRICS_FILE) if "recorded_by" not in r]
        summary = read_json(run_dir / SUMMARY_FILE)
        if own:
            views[0] = (own, {} if "record" in summary else summary)
    return dict(sorted(views.items()))


def merge_steps(records: dict[int, list[dict]]) -> list[dict]:
    """The run's steps from each node's, in step order, each marked with the node it came from
    (`recorded_by`)."""
    by_step: dict[int, list[tuple[int, dict]]] = {}
    for node, steps in sorted(records.items()):
        for rec in steps:
            by_step.setdefault(rec["step"], []).append((node, rec))
    merged = []
    for step in sorted(by_step):
        candidates = by_step[step]
        newest = max(rec.get("time", 0.0) for _, rec in candidates)
        current = [c for c in candidates if c[1].get("time", 0.0) >= newest - SAME_COMMIT_S]
        node, rec = min(current, key=lambda c: (bool(c[1].get("healed")), c[0]))
        kept = {k: v for k, v in rec.items() if k != "rewound_from"}  # one record, no rewinds
        merged.append({**kept, "recorded_by": node})
    return merged


def _digests(summary: dict) -> list:
    return list(summary.get("param_digests") or [summary.get("param_digest")])


def headline_summary(views: dict[int, View], steps: list[dict]) -> dict | None:
    """summary.json of the run from the nodes' summaries and the merged `steps`; None when no
    node finished (the run folder's summary.json stays as it is)."""
    finished = [n for n, (_, summary) in views.items() if summary.get("steps") is not None]
    if not finished or not steps:
        return None
    base = views[finished[0]][1]
    head = {k: v for k, v in base.items() if k != "node"}  # the run's, not one node's
    node_tokens = base.get("node_tokens")
    if isinstance(node_tokens, int):  # a summary from before the merge: its figures stay
        participants = sorted(r.get("participants", 1) for r in steps)
        head.update(summarize(steps, node_tokens * participants[len(participants) // 2]))
        head.update(run_fields(steps, int(base.get("nodes") or len(views)), node_tokens,
                               base.get("batches_per_node_step")))
    digests = {d for n in finished for d in _digests(views[n][1]) if d}
    head["replicas_in_sync"] = len(digests) <= 1 and bool(base.get("replicas_in_sync", True))
    head["record"] = {"merged_from": list(views), "finished": finished,
                      "steps_by_node": {str(n): sum(1 for r in steps if r["recorded_by"] == n)
                                        for n in views}}
    return head


def keep_headline(run_dir: Path) -> bool:
    """Write the run folder's metrics.jsonl (and summary.json, once a node finished) from every
    node's record there; False when there is none to merge (not a live run's folder)."""
    run_dir = Path(run_dir)
    views = node_views(run_dir)
    steps = merge_steps({n: recs for n, (recs, _) in views.items()})
    if not steps:
        return False
    write_atomic(run_dir / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in steps))
    summary = headline_summary(views, steps)
    if summary is not None:
        write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return True
