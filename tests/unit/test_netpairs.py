"""netcheck --pairs without a cluster: the round-robin schedule, the latency statistics, the
link matrix, the worst link, the gate on links, netcheck.json's `pairs` and the matrix table."""

from __future__ import annotations

import io
import itertools
import json
import threading

import pytest

from fatpipe.infra.outputs import parse_outputs
from fatpipe.ops.net.check import NetcheckOptions, netcheck_doc
from fatpipe.ops.net.gate import LinkResult, evaluate_gate, link_matrix, shared_node, worst_link
from fatpipe.trainer.net import bench as nb
from fatpipe.trainer.net.p2plat import MESSAGE_BYTES, EchoServer, rtt_samples, rtt_stats
from fatpipe.trainer.net.pairs import round_robin

MiB = 1 << 20

# --- the schedule -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(2, 10))
def test_round_robin_meets_every_pair_once_in_rounds_of_disjoint_pairs(n):
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    flat = [pair for r in rounds for pair in r]
    assert sorted(flat) == list(itertools.combinations(range(n), 2))  # each pair once, (lower, higher)
    for r in rounds:
        nodes = [node for pair in r for node in pair]
        assert len(nodes) == len(set(nodes))  # no node twice in a round: no shared link
        assert len(r) == n // 2  # as many pairs in parallel as the nodes allow


def test_round_robin_below_two_nodes_is_empty():
    assert round_robin(0) == [] and round_robin(1) == []


# --- latency and jitter -----------------------------------------------------------------------


def test_rtt_stats_by_hand():
    # 1..100 us: p50 is the 50th-ranked of 100 (index round(0.5 x 99) = 50 -> 51 us), p95 index 94 -> 95 us.
    stats = rtt_stats([i * 1e-6 for i in range(100, 0, -1)])
    assert stats["rtt_p50_s"] == pytest.approx(51e-6) and stats["rtt_p95_s"] == pytest.approx(95e-6)
    assert stats["jitter_s"] == pytest.approx(44e-6) and stats["rtt_count"] == 100
    assert stats["rtt_stddev_s"] == pytest.approx(28.866e-6, rel=1e-4)
    steady = rtt_stats([2e-4] * 20)
    assert steady["jitter_s"] == 0 and steady["rtt_stddev_s"] == 0
    with pytest.raises(ValueError):
        rtt_stats([])


def test_echo_round_trips_over_real_tcp():
    server = EchoServer("127.0.0.1", 0)
    port = server.listener.getsockname()[1]
    try:
        # Two clients at once, as two pairs of one round would be on different nodes.
        results = {}
        threads = [threading.Thread(target=lambda k=k: results.update({k: rtt_samples("127.0.0.1", port, 30)}))
                   for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        server.close()
    assert [len(results[k]) for k in range(2)] == [30, 30]
    assert all(0 < s < 1 for k in range(2) for s in results[k])
    assert MESSAGE_BYTES == 64


def test_rtt_to_nobody_raises_after_its_timeout():
    with pytest.raises(OSError):
        rtt_samples("127.0.0.1", 9, 5, connect_timeout=0.3)  # discard port: nothing listens


# --- the matrix, the worst link, the gate -----------------------------------------------------


def links_with_slow(node="n-1", n=4, slow_gbps=0.24):
    return [LinkResult(f"n-{i}", f"n-{j}", {1: slow_gbps if node in (f"n-{i}", f"n-{j}") else 0.95},
                       rtt_p50_s=1e-4, jitter_s=1e-5)
            for i, j in itertools.combinations(range(n), 2)]


def test_link_matrix_is_symmetric_with_an_empty_diagonal():
    nodes = ["n-0", "n-1", "n-2"]
    links = [{"a": "n-0", "b": "n-1", "v": 1}, {"a": "n-0", "b": "n-2", "v": 2}, {"a": "n-1", "b": "n-2", "v": 3}]
    m = link_matrix(nodes, links)
    assert [[c and c["v"] for c in row] for row in m] == [[None, 1, 2], [1, None, 3], [2, 3, None]]
    assert link_matrix(nodes, links[:1])[2] == [None, None, None]  # unmeasured: empty


def test_worst_link_prefers_a_failure_then_the_slowest():
    links = links_with_slow()
    assert worst_link(links).best_gbps == 0.24 and "n-1" in worst_link(links).name
    failed = LinkResult("n-2", "n-3", error="connection refused")
    assert worst_link([*links, failed]) is failed
    assert worst_link([]) is None


def test_shared_node_is_the_one_every_slow_link_touches():
    slow = [link for link in links_with_slow() if link.slow(0.8)]
    assert len(slow) == 3 and shared_node(slow) == "n-1"
    assert shared_node(slow[:1]) is None  # one link: either end could be at fault
    assert shared_node([LinkResult("n-0", "n-1"), LinkResult("n-2", "n-3")]) is None


def test_gate_names_each_slow_link():
    gate = evaluate_gate(1, 0.95, 256 * MiB, [], links=links_with_slow())
    assert not gate.passed
    assert gate.reasons == [f"link {a} <-> {b}: 0.24 Gbit/s is below 0.80 x 1 Gbit/s"
                            for a, b in (("n-0", "n-1"), ("n-1", "n-2"), ("n-1", "n-3"))]
    assert evaluate_gate(1, 0.95, 256 * MiB, [], links=links_with_slow(slow_gbps=0.9)).passed
    failed = evaluate_gate(1, 0.95, 256 * MiB, [], links=[LinkResult("a", "b", error="refused")])
    assert failed.reasons == ["link a <-> b failed: refused"]


def test_slow_busbw_hint_names_the_node_the_slow_links_share():
    gate = evaluate_gate(1, 0.23, 256 * MiB, [], links=links_with_slow())
    assert gate.reasons[-1].endswith("; slow: n-1")


# --- netcheck.json and the table from a recorded benchmark ------------------------------------


def outputs(n=4):
    return parse_outputs({
        "name": "n", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.72.0.0/24",
        "nodes": [{"name": f"n-{i}", "private_ip": f"10.72.0.{10 + i}", "transport": "netns",
                   "netns": f"fp-n-{i}"} for i in range(n)],
    })


def bench(slow=1, n=4):
    rows = [nb.sweep_row(MiB, MiB * 8 * nb.bus_factor(n) / 0.9e9, n, 5, 20)]
    links = []
    for number, pairs in enumerate(round_robin(n)):
        for i, j in pairs:
            gbps = 0.24 if slow in (i, j) else 0.95
            links.append({"a": f"host-{i}", "a_ip": f"10.72.0.{10 + i}", "a_node": i,
                          "b": f"host-{j}", "b_ip": f"10.72.0.{10 + j}", "b_node": j, "tool": "iperf3",
                          "gbps_by_streams": {"1": gbps, "4": gbps - 0.01}, "error": None, "round": number,
                          "rtt_p50_s": 1.5e-4, "rtt_p95_s": 2e-4, "jitter_s": 5e-5, "rtt_count": 50})
    return {"backend": "gloo", "world_size": n, "nnodes": n, "allreduce": rows,
            "busbw_gbps": 0.9, "busbw_size": MiB, "latency_s": 3e-4, "latency_bytes": 4, "p2p": None,
            "pairs": {"tool": "iperf3", "port": 29401, "latency_port": 29402, "seconds": 1.0,
                      "streams": [1, 4], "rounds": [], "links": links}}


def test_doc_pairs_section_names_the_slow_links_by_private_ip():
    doc = netcheck_doc(bench(), outputs(), NetcheckOptions(pairs=True))
    pairs = doc["pairs"]
    assert pairs["nodes"] == ["n-0", "n-1", "n-2", "n-3"] and len(pairs["links"]) == 6
    assert {(link["a"], link["b"]) for link in pairs["links"] if link["slow"]} == {
        ("n-0", "n-1"), ("n-1", "n-2"), ("n-1", "n-3")}
    assert pairs["slow_node"] == "n-1" and "n-1" in (pairs["worst"]["a"], pairs["worst"]["b"])
    assert pairs["worst"]["best_gbps"] == 0.24
    assert [r for r in doc["gate"]["reasons"] if r.startswith("link ")] == [
        "link n-0 <-> n-1: 0.24 Gbit/s is below 0.80 x 1 Gbit/s",
        "link n-1 <-> n-2: 0.24 Gbit/s is below 0.80 x 1 Gbit/s",
        "link n-1 <-> n-3: 0.24 Gbit/s is below 0.80 x 1 Gbit/s"]
    json.dumps(doc)
    assert netcheck_doc({**bench(), "pairs": None}, outputs(), NetcheckOptions())["pairs"] is None


def test_matrix_table_names_the_worst_and_the_slow_links():
    from rich.console import Console

    from fatpipe.cli.render import netcheck_tables

    doc = netcheck_doc(bench(slow=2), outputs(), NetcheckOptions(pairs=True))
    buf = io.StringIO()
    netcheck_tables(doc, Console(file=buf, width=120))
    text = buf.getvalue()
    assert "every pair" in text and "0.950" in text and "0.240" in text and "150 ± 50" in text
    assert "worst link: n-0 <-> n-2, 0.240 Gbit/s (24% of the 1 Gbit/s tier)" in text
    assert "links below the bar: n-0 <-> n-2, n-1 <-> n-2, n-2 <-> n-3 (all touch n-2)" in text


def test_options_ask_netbench_for_pairs_and_allow_for_their_rounds():
    plain, pairs = NetcheckOptions(quick=True), NetcheckOptions(quick=True, pairs=True)
    assert "--pairs" not in plain.netbench_args(outputs(), "x.json")
    assert "--pairs" in pairs.netbench_args(outputs(), "x.json")
    assert pairs.estimate_s(4, 1) > plain.estimate_s(4, 1)
    assert pairs.estimate_s(5, 1) > pairs.estimate_s(4, 1)  # 5 rounds for 5 nodes, 3 for 4
    assert nb.parse_args(["--out", "x", "--pairs"]).pairs and not nb.parse_args(["--out", "x"]).pairs


def test_cli_flag_reaches_the_options(run_cli, project_dir, monkeypatch):
    (project_dir / "fatpipe.toml").write_text(
        '[clusters.n]\nprovider = "sim"\nnodes = 4\nprivate_cidr = "10.72.0.0/24"\n')
    state = project_dir / ".fatpipe" / "n"
    state.mkdir(parents=True)
    (state / "outputs.json").write_text(json.dumps(outputs().model_dump(mode="json")))
    seen = {}

    def fake(cluster, run_dir, options, sink=None, remote_python=None, refuse_running=False):
        seen["options"] = options
        return bench()

    monkeypatch.setattr("fatpipe.ops.net.check.launch_netbench", fake)
    result = run_cli("netcheck", "n", "--pairs")
    assert result.exit_code == 1 and seen["options"].pairs
    assert "Error: netcheck failed: link n-0 <-> n-1: 0.24 Gbit/s is below" in result.output
    assert "(all touch n-1)" in result.output


def test_report_shows_the_matrix(tmp_path):
    from fatpipe.ops.plan.report import write_report

    doc = netcheck_doc(bench(slow=3), outputs(), NetcheckOptions(pairs=True))
    (tmp_path / "netcheck.json").write_text(json.dumps(doc))
    page = write_report(tmp_path).read_text()
    matrix = page[page.index("<h2>every pair"):]
    assert matrix.count("<tr>") == 5 and matrix.count('style="color:#c00"') == 6  # 3 links, both halves
    assert "worst link: n-0 &lt;-&gt; n-3, 0.240 Gbit/s; below the bar: 3 link(s), all touching n-3" in matrix
