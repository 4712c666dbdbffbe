"""Per-node measurements on synthetic numbers: window statistics, the straggler verdict (compute
and link), sync-time events against the run's baseline, real TCP counters of this process, and
`fatpipe top` reading a run folder (locally and through the command a remote node runs)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from fatpipe.ops.reach.cluster import Cluster
from fatpipe.trainer import nodestats
from fatpipe.trainer.nodestats import (
    SyncWatch,
    cluster_view,
    find_straggler,
    link_estimates,
    merge_ranks,
    window_summary,
)
from fatpipe.trainer.tcpinfo import peer_rates, tcp_counters


def rank(r: int, compute: float = 0.1, wait: float = 0.05, peers=None, node=None, local=0) -> dict:
    """One rank's window summary as the trainer publishes it."""
    return {"rank": r, "local_rank": local, "node_rank": r if node is None else node,
            "node": f"n-{r if node is None else node}", "ip": f"10.0.0.{r if node is None else node}",
            "first_step": 1, "last_step": 10, "steps": 10, "tx_gbps": 0.5, "rx_gbps": 0.4,
            "step_s_p50": compute + wait, "step_s_p95": compute + wait, "sync_s_p50": wait,
            "sync_s_p95": wait, "wait_s_p50": wait, "wait_s_p95": wait,
            "compute_s_p50": compute, "compute_s_p95": compute, "peers": peers or {}}


def ring(rates: dict[tuple[int, int], float], n: int = 4, compute=None, wait=None) -> list[dict]:
    """n ranks on n nodes sending around a ring r -> r-1 (as gloo does), with these pair rates."""
    out = []
    for r in range(n):
        dst = (r - 1) % n
        out.append(rank(r, (compute or {}).get(r, 0.1), (wait or {}).get(r, 0.05),
                        {f"10.0.0.{dst}": rates.get((r, dst), 1.0)}))
    return out


def test_window_summary_splits_compute_from_the_exposed_wait():
    records = [{"step": s, "step_s": 0.2 + s / 100, "sync_s": 0.08, "exposed_comm_s": 0.05}
               for s in range(1, 11)]
    w = window_summary(records)
    assert (w["first_step"], w["last_step"], w["steps"]) == (1, 10, 10)
    assert w["step_s_p50"] == pytest.approx(0.255)
    assert w["compute_s_p50"] == pytest.approx(0.205)
    assert w["sync_s_p95"] == pytest.approx(0.08) and w["wait_s_p50"] == pytest.approx(0.05)
    assert w["step_s_p95"] > w["step_s_p50"]


def test_ranks_of_one_node_merge_into_its_slowest():
    ranks = [rank(0, node=0), rank(1, 0.3, node=0, local=1, peers={"10.0.0.1": 2.0}),
             rank(2, node=1, peers={"10.0.0.0": 0.5})]
    nodes = merge_ranks(ranks)
    assert [n["node"] for n in nodes] == ["n-0", "n-1"]
    assert nodes[0]["ranks"] == [0, 1] and nodes[0]["compute_s_p50"] == pytest.approx(0.3)
    assert nodes[0]["peers"] == {"10.0.0.1": 2.0}


def test_the_node_whose_pairs_are_all_slow_has_the_slow_link():
    # Node 2 shaped: it sends slowly (2 -> 1) and receives slowly (3 -> 2); 1 and 3 keep a fast pair.
    nodes = merge_ranks(ring({(2, 1): 0.23, (3, 2): 0.24}))
    links = link_estimates(nodes)
    assert links["n-2"] == pytest.approx(0.24)
    assert min(links, key=links.get) == "n-2" and links["n-1"] >= 1.0 and links["n-3"] >= 1.0


def test_a_slow_link_is_the_straggler_with_its_rate_and_the_tier():
    view = cluster_view(ring({(2, 1): 0.23, (3, 2): 0.25}), tier_gbps=1.0)
    assert view["straggler"]["node"] == "n-2" and view["straggler"]["kind"] == "link"
    assert view["straggler"]["reason"] == "n-2: link 0.25 Gbit/s, tier 1"
    assert [n["link_gbps"] is not None for n in view["nodes"]] == [True] * 4
    assert view["nodes"][0]["util"] == pytest.approx(0.5)


def test_a_window_where_a_neighbours_fast_pair_reads_slow_names_nobody_not_the_neighbour():
    # Node 2 shaped (2 -> 1 and 3 -> 2 slow); node 3's one fast pair (0 -> 3) read slow this
    # window: node 3's estimate is the pair it shares with node 2, just under node 2's own.
    rates = {(2, 1): 0.24, (3, 2): 0.22, (0, 3): 0.20}
    links = link_estimates(merge_ranks(ring(rates)))
    assert links["n-3"] < links["n-2"]
    assert cluster_view(ring(rates), tier_gbps=1.0)["straggler"] is None
    # The next window reads it right again: node 2, clearly.
    assert cluster_view(ring({(2, 1): 0.24, (3, 2): 0.22, (0, 3): 0.9}), 1.0)["straggler"]["node"] == "n-2"


def test_a_link_near_the_tier_is_never_slow_however_fast_the_others_burst():
    view = cluster_view(ring({(2, 1): 0.95, (3, 2): 0.95, (0, 3): 3.0, (1, 0): 3.0}), tier_gbps=1.0)
    assert view["straggler"] is None


def test_slow_compute_is_named_when_that_node_waits_least():
    ranks = ring({}, compute={1: 0.16}, wait={0: 0.07, 1: 0.01, 2: 0.07, 3: 0.07})
    s = find_straggler(merge_ranks(ranks), 1.0)
    assert s["node"] == "n-1" and s["kind"] == "compute"
    assert s["reason"] == "n-1: compute 1.6x the median"


def test_slow_compute_that_also_waits_longest_is_not_the_straggler():
    ranks = ring({}, compute={1: 0.2}, wait={0: 0.01, 1: 0.2, 2: 0.01, 3: 0.01})
    assert find_straggler(merge_ranks(ranks), 1.0) is None


def test_an_even_cluster_has_no_straggler():
    assert find_straggler(merge_ranks(ring({})), 1.0) is None
    assert find_straggler(merge_ranks(ring({})[:1]), 1.0) is None


def view(sync: float, straggler: dict | None = None, nodes=None) -> dict:
    return {"first_step": 1, "last_step": 10, "sync_s_p50": sync, "straggler": straggler,
            "nodes": nodes or merge_ranks(ring({}))}


def test_sync_far_above_the_baseline_is_an_event_naming_the_suspect_once():
    watch = SyncWatch()
    assert all(watch.update(view(0.1)) == [] for _ in range(nodestats.BASELINE_WINDOWS))
    assert watch.baseline == pytest.approx(0.1)
    assert watch.update(view(0.15)) == []  # 1.5x: within the baseline's range
    nodes = cluster_view(ring({(2, 1): 0.2, (3, 2): 0.2}), None)["nodes"]
    [event] = watch.update(view(0.25, nodes=nodes))
    assert event["event"] == "sync_slow" and event["node"] == "n-2"
    assert event["ratio"] == pytest.approx(2.5) and "slowest link" in event["reason"]
    assert watch.update(view(0.3)) == []  # still slow: said once
    [back] = watch.update(view(0.11))
    assert back["event"] == "sync_recovered"


def test_a_straggler_event_needs_consecutive_windows_and_is_cleared_later():
    watch = SyncWatch()
    s = {"node": "n-2", "kind": "link", "reason": "n-2: link 0.25 Gbit/s, tier 1"}
    assert watch.update(view(0.1, s)) == []
    assert watch.update(view(0.1, None)) == []  # one window is not enough
    assert watch.update(view(0.1, s)) == []
    [named] = watch.update(view(0.1, s))
    assert named["event"] == "straggler" and named["node"] == "n-2" and named["reason"] == s["reason"]
    assert watch.update(view(0.1, s)) == []
    watch.update(view(0.1, None))
    [cleared] = watch.update(view(0.1, None))
    assert cleared["event"] == "straggler_cleared" and cleared["node"] == "n-2"


def test_tcp_counters_see_this_process_sending_on_a_real_connection():
    # The receiver is another process: one in this one would compete for the GIL, and the time
    # the sender then spends held by the receiver's window is, rightly, not counted as busy.
    server = socket.create_server(("127.0.0.1", 0))
    reader = subprocess.Popen([sys.executable, "-c", "import socket, sys\n"
                               "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
                               "while s.recv(1 << 20): pass", str(server.getsockname()[1])])
    conn, _ = server.accept()
    size = 32 << 20
    try:
        before = tcp_counters()
        conn.sendall(b"x" * size)
        deadline = time.monotonic() + 10  # sendall returns once the data is buffered, not acked
        while (after := tcp_counters())["127.0.0.1"][0] < size and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        conn.close()
        server.close()
        reader.wait(10)
    assert after["127.0.0.1"][0] - before.get("127.0.0.1", (0, 0))[0] >= size
    assert peer_rates(before, after)["127.0.0.1"] > 0
    assert peer_rates(after, after) == {}  # nothing sent: no rate


def test_top_reads_the_newest_view_and_events(project_dir, run_cli):
    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.infra.project import load_project
    from fatpipe.infra.runs import mark_latest, new_run
    from fatpipe.ops.rdzv.noderun import node_runs
    from fatpipe.ops.rdzv.rendezvous import new_rendezvous, read_rendezvous
    from fatpipe.ops.run.top import parse_tail, snapshot, tail_command

    project = load_project()
    run_id, run_dir = new_run(project, "demo")
    nodes = [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local"} for i in range(2)]
    new_rendezvous(Cluster(project, outputs=parse_outputs({"name": "demo", "provider": "sim", "tier_gbps": 1,
                                            "private_cidr": "10.42.0.0/24", "nodes": nodes})), run_id, run_dir)
    mark_latest(project, "demo", run_id)
    assert run_cli("top", "--once").exit_code == 1  # no node metrics yet: one line
    first = {"window": 0, "attempt": 1, **cluster_view(ring({}), 1.0)}
    last = {"window": 1, "attempt": 1, **cluster_view(ring({(2, 1): 0.2, (3, 2): 0.2}), 1.0)}
    (run_dir / "nodes.jsonl").write_text(f"{json.dumps(first)}\n{json.dumps(last)}\n{{\"torn")
    (run_dir / "events.jsonl").write_text(json.dumps({"event": "straggler", "node": "n-2"}) + "\n")
    snap = snapshot(Cluster.resolve(project, "demo"))
    assert snap["run"] == run_id and snap["window"]["window"] == 1 and not snap["finished"]
    assert snap["straggler"]["node"] == "n-2" and snap["events"][0]["node"] == "n-2"
    # What an ssh node runs, run here through bash: the same answer.
    node = node_runs(read_rendezvous(run_dir), Cluster.resolve(project, "demo"))[0]
    result = node.transport.run(tail_command(node), timeout=30)
    views, events, finished = parse_tail(result.stdout)
    assert views[-1]["straggler"]["node"] == "n-2" and len(events) == 1 and not finished
    printed = run_cli("top", "--json")
    assert printed.exit_code == 0 and json.loads(printed.output)["straggler"]["node"] == "n-2"
    table = run_cli("top", "--once")
    assert table.exit_code == 0 and "n-2: link 0.20 Gbit/s, tier 1" in " ".join(table.output.split())
    (run_dir / "summary.json").write_text("{}")  # the run finished: the live view shows it once and ends
    live = run_cli("top", "--interval", "0.5")
    assert live.exit_code == 0 and f"run {run_id} has finished" in live.output
    assert run_cli("top", "--run", "nope").exit_code == 2
