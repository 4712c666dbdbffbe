"""Per-node window statistics, the straggler verdict and sync-time events: pure functions on numbers.

Each rank summarises its last window of steps (`window_summary`); rank 0 merges the ranks of one
node (`merge_ranks`), estimates every node's link from the TCP pairs it sends or receives on
(`link_estimates`), names the node holding the others up (`find_straggler`) and turns a run of
windows into events (`SyncWatch`). Nothing here reads a clock, a file or the network, so the
rules are tested on synthetic numbers (docs/ARCHITECTURE.md, "The run folder").
"""

from __future__ import annotations

import statistics

from .metrics import percentile

NODES_FILE, EVENTS_FILE = "nodes.jsonl", "events.jsonl"  # in the run folder, by rank 0
COMPUTE_FACTOR = 1.5  # a node whose compute is this many times the median holds the others up
LINK_FRACTION = 0.5  # a node whose link reaches less than this share of the others' median
LINK_OK_SHARE = 0.9  # ...but a link within this share of the tier is never called slow
LINK_CLEAR_FACTOR = 1.5  # ...and only when every other node's estimate is this many times its own
SLOW_FACTOR = 2.0  # a window's sync time this many times the run's baseline is an event
RECOVER_FACTOR = 1.5  # and below this many times the baseline the run has recovered
BASELINE_WINDOWS = 3  # the run's own baseline: the median of its first windows' sync time
CONFIRM_WINDOWS = 2  # a straggler verdict must hold this many windows in a row to be an event


def window_summary(records: list[dict]) -> dict:
    """One rank's view of its window: step, sync, exposed-wait and compute time percentiles.

    `records` are the trainer's per-step records (step_s, sync_s, exposed_comm_s). Compute is
    the step minus the communication nothing hid: what this rank spent on its own work.
    """
    out: dict = {"steps": len(records),
                 "first_step": records[0]["step"] if records else None,
                 "last_step": records[-1]["step"] if records else None,
                "time_s": sum(r["step_s"] for r in records)}
    series = {
        "step_s": [r["step_s"] for r in records],
        "sync_s": [r["sync_s"] for r in records],
        "wait_s": [r["exposed_comm_s"] for r in records],
        "compute_s": [max(0.0, r["step_s"] - r["exposed_comm_s"]) for r in records],
    }
    for key, values in series.items():
        out[f"{key}_p50"] = percentile(values, 50)
        out[f"{key}_p95"] = percentile(values, 95)
    return out


def merge_ranks(ranks: list[dict]) -> list[dict]:
    """One entry per node from its ranks' summaries, in node order.

    A node is as slow as its slowest rank; its NIC is shared, so its rates are the first local
    rank's; its TCP pairs are every rank's (the fastest reading per peer).
    """
    by_node: dict[str, list[dict]] = {}
    for r in sorted(ranks, key=lambda r: (r.get("node_rank", 0), r.get("local_rank", 0))):
        by_node.setdefault(r["node"], []).append(r)
    nodes = []
    for name, group in by_node.items():
        first = group[0]
        node = {"node": name, "node_rank": first.get("node_rank"), "ip": first.get("ip"),
                "ranks": [r["rank"] for r in group],
                "tx_gbps": first.get("tx_gbps", 0.0), "rx_gbps": first.get("rx_gbps", 0.0)}
        for key in first:
            if key.endswith(("_p50", "_p95")) or key in ("time_s", "cost_s"):
                node[key] = max(r[key] for r in group)
        peers: dict[str, float] = {}
        for r in group:
            for ip, gbps in (r.get("peers") or {}).items():
                peers[ip] = max(gbps, peers.get(ip, 0.0))
        node["peers"] = peers
        nodes.append(node)
    return nodes


def link_estimates(nodes: list[dict]) -> dict[str, float]:
    """Each node's link rate: the fastest TCP pair it sent or received on, in Gbit/s.

    A pair runs at the slower of its two ends, so a pair's rate bounds both nodes' links from
    below. In a ring all-reduce every node sends to one neighbour and receives from another:
    the node with the slow link is the one whose pairs are *all* slow, while each neighbour
    still has one fast pair. Nodes without a measured pair are left out.
    """
    by_ip = {n["ip"]: n["node"] for n in nodes if n.get("ip")}
    best: dict[str, float] = {}
    for n in nodes:
        for ip, gbps in (n.get("peers") or {}).items():
            peer = by_ip.get(ip)
            if peer is None or peer == n["node"]:
                continue
            for name in (n["node"], peer):
                best[name] = max(gbps, best.get(name, 0.0))
    return best


def find_straggler(nodes: list[dict], tier_gbps: float | None) -> dict | None:
    """The node holding the others up, with the reason in words; None when no node stands out.

    Compute: in an all-reduce the slowest node waits least while the others wait for it, so a
    node whose compute is COMPUTE_FACTOR times the median and whose wait is at most the median
    is the one. Link: a node whose link estimate is below LINK_FRACTION of the others' median
    (and not close to the tier), and clearly below every other one's (LINK_CLEAR_FACTOR). When
    both rules name a node, the larger ratio wins.

    The clear margin: a slow node's ring neighbours each share one slow pair with it and keep
    one fast pair, which alone lifts their estimate. When that fast pair reads slow for a window
    (a loaded machine delays its acks), the neighbour's estimate drops to the shared slow pair,
    level with or just under the slow node's: that window is ambiguous and names nobody.
    """
    found = []
    if len(nodes) >= 2:
        median = statistics.median(n["compute_s_p50"] for n in nodes)
        worst = max(nodes, key=lambda n: n["compute_s_p50"])
        waits = statistics.median(n["wait_s_p50"] for n in nodes)
        ratio = worst["compute_s_p50"] / median if median > 0 else 0.0
        if ratio >= COMPUTE_FACTOR and worst["wait_s_p50"] <= waits:
            found.append({"node": worst["node"], "kind": "compute", "ratio": ratio,
                          "reason": f"{worst['node']}: compute {ratio:.1f}x the median"})
    links = {n["node"]: n["link_gbps"] for n in nodes if n.get("link_gbps")}
    if len(links) >= 3:
        slow = min(links, key=links.get)
        others = statistics.median(v for k, v in links.items() if k != slow)
        near_tier = tier_gbps is not None and links[slow] >= LINK_OK_SHARE * tier_gbps
        runner_up = min(v for k, v in links.items() if k != slow)
        clear = runner_up >= LINK_CLEAR_FACTOR * links[slow]
        if links[slow] < LINK_FRACTION * others and not near_tier and clear:
            tier = f", tier {tier_gbps:g}" if tier_gbps else ""
            found.append({"node": slow, "kind": "link", "ratio": others / links[slow],
                          "reason": f"{slow}: link {links[slow]:.2f} Gbit/s{tier}"})
    return max(found, key=lambda s: s["ratio"]) if found else None


def cluster_view(ranks: list[dict], tier_gbps: float | None) -> dict:
    """Rank 0's line for one window: every node, the cluster's step and sync p50, the straggler."""
    nodes = merge_ranks(ranks)
    links = link_estimates(nodes)
    for n in nodes:
        n["link_gbps"] = links.get(n["node"])
        n["util"] = max(n["tx_gbps"], n["rx_gbps"]) / tier_gbps if tier_gbps else None
    return {
        "first_step": min((r["first_step"] for r in ranks if r.get("first_step")), default=None),
        "last_step": max((r["last_step"] for r in ranks if r.get("last_step")), default=None),
        "tier_gbps": tier_gbps,
        "step_s_p50": statistics.median(n["step_s_p50"] for n in nodes) if nodes else 0.0,
        "sync_s_p50": statistics.median(n["sync_s_p50"] for n in nodes) if nodes else 0.0,
        "nodes": nodes,
        "straggler": find_straggler(nodes, tier_gbps),
    }


def suspect(view: dict) -> tuple[str | None, str]:
    """The node to blame for a slow window and why: the straggler, else the slowest link, else
    the slowest compute."""
    if view.get("straggler"):
        return view["straggler"]["node"], view["straggler"]["reason"]
    nodes = view.get("nodes") or []
    with_link = [n for n in nodes if n.get("link_gbps")]
    if with_link:
        n = min(with_link, key=lambda n: n["link_gbps"])
        return n["node"], f"{n['node']}: slowest link, {n['link_gbps']:.2f} Gbit/s"
    if nodes:
        n = max(nodes, key=lambda n: n["compute_s_p50"])
        return n["node"], f"{n['node']}: slowest compute, {n['compute_s_p50'] * 1e3:.0f} ms"
    return None, "no node data"


class SyncWatch:
    """Turns rank 0's window views into events: a straggler named (held CONFIRM_WINDOWS windows)
    or cleared, and the sync time leaving (SLOW_FACTOR) or returning (RECOVER_FACTOR) to the
    run's own baseline, the median sync p50 of its first BASELINE_WINDOWS windows."""

    def __init__(self) -> None:
        self.first: list[float] = []
        self.baseline: float | None = None
        self.slow = False
        self.announced: tuple[str, str] | None = None  # (node, kind) last named in an event
        self.streak: tuple[tuple[str, str] | None, int] = (None, 0)

    def update(self, view: dict) -> list[dict]:
        at = {"first_step": view.get("first_step"), "last_step": view.get("last_step")}
        return [{**at, **e} for e in self._straggler(view) + self._sync(view)]

    def _straggler(self, view: dict) -> list[dict]:
        s = view.get("straggler")
        verdict = (s["node"], s["kind"]) if s else None
        seen, count = self.streak
        self.streak = (verdict, count + 1 if verdict == seen else 1)
        if self.streak[1] < CONFIRM_WINDOWS or verdict == self.announced:
            return []
        before, self.announced = self.announced, verdict
        if verdict is None:
            return [{"event": "straggler_cleared", "node": before[0],
                     "reason": f"{before[0]}: no longer holding the others up"}]
        return [{"event": "straggler", "node": s["node"], "kind": s["kind"], "reason": s["reason"]}]

    def _sync(self, view: dict) -> list[dict]:
        sync = view.get("sync_s_p50") or 0.0
        if self.baseline is None:
            self.first.append(sync)
            if len(self.first) >= BASELINE_WINDOWS:
                self.baseline = statistics.median(self.first)
            return []
        if self.baseline <= 0:
            return []
        ratio = sync / self.baseline
        common = {"sync_s_p50": sync, "baseline_s": self.baseline, "ratio": ratio}
        if not self.slow and ratio >= SLOW_FACTOR:
            self.slow = True
            node, why = suspect(view)
            return [{"event": "sync_slow", "node": node, **common,
                     "reason": f"sync {ratio:.1f}x the run's baseline; suspect {why}"}]
        if self.slow and ratio < RECOVER_FACTOR:
            self.slow = False
            return [{"event": "sync_recovered", "node": None, **common,
                     "reason": f"sync back to {ratio:.1f}x the run's baseline"}]
        return []
