"""Joins, leaves and goodput of a live run, read from its steps' records (metrics.jsonl).

Each committed step records how many replica groups made its mean (`participants`), the wall
time it ended at (`time`) and the attempts it took on this node (`attempts`: the ones before the
last failed their exchange across the groups). A step whose count is lower than the step before
it is a leave, a higher one a join; what it cost is the wall time from the step before it beyond
a median step (the failed attempts, the quorum without the lost node, a returning node's copy of
the state). The same functions read one node's record and the run's, merged from every node's
(`ops.run.headline`), so the summary of either says the same things the same way.
"""

from __future__ import annotations

import statistics
import time

from ..bandwidth import busbw_gbs


def step_fields(participants: int, healed: bool, quorum_s: float, rec: dict,
                attempts: int = 1, split: dict | None = None) -> dict:
    """What a live step adds to its record (metrics.jsonl): the replica groups in its mean,
    whether this one was sent the live state, the quorum's wait, the attempts it took here, the
    wall time it ended at, and the bus bandwidth over the groups that took part. `split`: where a
    step's time beyond its own went, where the trainer knows it (the failed attempts' seconds,
    the quorum's request to the Lighthouse, the cross-node group's reconfigure)."""
    busbw = busbw_gbs(rec["wire_bytes"], rec["sync_s"], participants) * 8 if rec["sync_s"] else 0.0
    return {"participants": participants, "healed": healed, "quorum_s": quorum_s,
            "attempts": attempts, "time": time.time(), "busbw_gbps": busbw,
            **{key: round(value, 4) for key, value in (split or {}).items()}}


class Attempts:
    """The attempts this node made at one step number. A node that heals jumps to the quorum's
    step: the attempts it failed at its old step were not the run's (the quorum went on without
    it), so the step it then commits took one."""

    def __init__(self):
        self.step: int | None = None
        self.count = 0

    def begin(self, step: int) -> None:
        """An attempt at `step` starts."""
        if step != self.step:
            self.step, self.count = step, 0
        self.count += 1

    def of(self, committed: int) -> int:
        """The attempts step `committed` took here."""
        return self.count if committed == self.step else 1


class QuorumWatch:
    """The replica groups of each committed step, against the step before: a change is an
    event for `fatpipe top` (node_left, node_joined)."""

    def __init__(self):
        self.groups: int | None = None

    def update(self, step: int, participants: int) -> tuple[str, str] | None:
        before, self.groups = self.groups, participants
        if before is None or before == participants:
            return None
        event = "node_joined" if participants > before else "node_left"
        return event, f"{before} -> {participants} replica groups at step {step}"


def membership(records: list[dict]) -> list[dict]:
    """One entry per change in the quorum: step, "join"/"leave", replica groups before and
    after, and the seconds the change cost beyond a median step."""
    live = [r for r in records if "participants" in r and "time" in r]
    if len(live) < 2:
        return []
    median_s = statistics.median(r["step_s"] for r in live)
    changes = []
    for before, now in zip(live, live[1:], strict=False):
        if now["participants"] == before["participants"]:
            continue
        gap = now["time"] - before["time"]
        changes.append({
            "step": now["step"],
            "event": "join" if now["participants"] > before["participants"] else "leave",
            "replica_groups": [before["participants"], now["participants"]],
            "seconds_lost": round(max(0.0, gap - median_s), 3),
        })
    return changes


def goodput(records: list[dict], per_participant_tokens: int) -> dict:
    """Useful tokens per second of wall time over the recorded steps: each committed step's
    tokens (those of the replica groups that made it), over the time from the first step's
    start to the last step's end. Steps taken again after a failure count once."""
    live = [r for r in records if "participants" in r and "time" in r]
    if not live:
        return {"tokens": 0, "wall_s": 0.0, "tokens_per_s": 0.0}
    tokens = sum(r["participants"] * per_participant_tokens for r in live)
    wall = live[-1]["time"] - (live[0]["time"] - live[0]["step_s"])
    return {"tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": tokens / wall if wall > 0 else 0.0}


def skipped_batches(records: list[dict], nodes: int, batches_per_node_step: int) -> int:
    """Batches no node read: each step reads the batches of the nodes in its quorum only, so a
    node that is down leaves its share of that step's data unread (counted, never hidden)."""
    return sum(max(0, nodes - r["participants"]) * batches_per_node_step
               for r in records if "participants" in r)


def exchanges(records: list[dict]) -> dict:
    """The gradient exchanges across the replica groups: one per attempt at a committed step,
    failed when the step did not commit then (a record from before `attempts`: one)."""
    tried = sum(max(1, int(r.get("attempts", 1))) for r in records)
    failed = tried - len(records)
    return {"sync_exchanges": tried, "failed_exchanges": failed,
            "sync_failure_rate": failed / tried if tried else 0.0}


def run_fields(records: list[dict], nodes: int, node_tokens: int,
               batches_per_node_step: int | None = None) -> dict:
    """What summary.json says of a live run from its steps' records: the declared nodes, each
    join and leave, goodput, the exchanges that failed, and the batches no node read (the
    built-in trainer's, which reads its data by step: `batches_per_node_step`)."""
    fields = {"nodes": nodes, "node_tokens": node_tokens, "membership": membership(records),
              "goodput": goodput(records, node_tokens), **exchanges(records)}
    if batches_per_node_step is not None:
        fields["batches_per_node_step"] = batches_per_node_step
        fields["skipped_batches"] = skipped_batches(records, nodes, batches_per_node_step)
    return fields
