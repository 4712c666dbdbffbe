"""netcheck without processes: the busbw arithmetic by hand, the gate's decisions, the report files, the CLI."""

from __future__ import annotations

import io
import json

import pytest

from fatpipe.infra.outputs import parse_outputs
from fatpipe.ops.net.check import NetcheckOptions, netcheck_doc, pairs_from_bench
from fatpipe.ops.net.gate import PairResult, evaluate_gate
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.trainer.net import bench as nb

MiB = 1 << 20


# --- arithmetic: nccl-tests' definitions, checked against values worked out by hand ----------


def test_bus_factor_is_two_n_minus_one_over_n():
    assert nb.bus_factor(1) == 0.0
    assert nb.bus_factor(2) == 1.0
    assert nb.bus_factor(4) == 1.5
    assert nb.bus_factor(8) == 1.75


def test_busbw_by_hand_256_mib_on_4_ranks():
    # 268435456 B in 3.2 s: algbw = 268435456 / 3.2 / 1e9 = 0.08388608 GB/s;
    # busbw = 0.08388608 x 2 x 3 / 4 = 0.12582912 GB/s = 1.00663296 Gbit/s.
    row = nb.sweep_row(256 * MiB, 3.2, world_size=4, warmup=1, iters=3)
    assert row["size"] == 268435456 and row["count"] == 67108864 and row["type"] == "float"
    assert row["algbw_gbs"] == pytest.approx(0.08388608, rel=1e-12)
    assert row["busbw_gbs"] == pytest.approx(0.12582912, rel=1e-12)
    assert row["algbw_gbps"] == pytest.approx(0.67108864, rel=1e-12)
    assert row["busbw_gbps"] == pytest.approx(1.00663296, rel=1e-12)


def test_busbw_by_hand_other_world_sizes():
    # 1 MiB in 1 ms on 2 ranks: algbw = 1048576 / 0.001 / 1e9 = 1.048576 GB/s, factor 1.
    assert nb.busbw_gbs(MiB, 1e-3, 2) == pytest.approx(1.048576)
    # 64 MiB in 0.5 s on 8 ranks: algbw = 0.134217728 GB/s, x 1.75 = 0.234881024 GB/s.
    assert nb.busbw_gbs(64 * MiB, 0.5, 8) == pytest.approx(0.234881024)
    # One rank: no bus at all.
    assert nb.busbw_gbs(64 * MiB, 0.5, 1) == 0.0


def test_link_rate_gives_busbw_equal_to_the_link_whatever_n():
    # A ring all-reduce moves 2(n-1)/n x size per rank: at exactly 1 Gbit/s that takes
    # size x 8 x 2(n-1)/n / 1e9 seconds, and busbw comes out as the link rate for every n.
    for n in (2, 3, 4, 16):
        seconds = 256 * MiB * 8 * nb.bus_factor(n) / 1e9
        assert nb.busbw_gbs(256 * MiB, seconds, n) * 8 == pytest.approx(1.0)


@pytest.mark.parametrize("text,value", [
    ("1M", MiB), ("256M", 256 * MiB), ("256MiB", 256 * MiB), ("64k", 64 << 10), ("1G", 1 << 30),
    ("4096", 4096), (512, 512),
])
def test_parse_size(text, value):
    assert nb.parse_size(text) == value


def test_parse_size_refuses_junk():
    with pytest.raises(ValueError, match="not a size"):
        nb.parse_size("1.5M")


def test_sweep_sizes_are_powers_of_two_from_1m_to_256m():
    sizes = nb.sweep_sizes(MiB, 256 * MiB)
    assert sizes == [MiB << i for i in range(9)]
    assert nb.sweep_sizes(MiB, 3 * MiB) == [MiB, 2 * MiB]
    with pytest.raises(ValueError):
        nb.sweep_sizes(4 * MiB, MiB)


def test_iteration_counts_are_a_pure_function_with_few_at_large_sizes():
    for quick in (False, True):
        for size in nb.sweep_sizes(MiB, 256 * MiB):
            warmup, iters = nb.iterations(size, quick)
            assert (warmup, iters) == nb.iterations(size, quick)
            assert warmup >= 1 and iters >= 2
    assert nb.iterations(256 * MiB) == (1, 3)
    assert nb.iterations(MiB) == (5, 20)
    assert nb.iterations(32 * MiB, quick=True) == (1, 4)  # the quick sweep's gated size
    # A full sweep moves a bounded number of bytes: ~1.5 x that per rank on 4 nodes, ~40 s at 1 Gbit/s.
    total = sum(size * sum(nb.iterations(size)) for size in nb.sweep_sizes(MiB, 256 * MiB))
    assert total * 1.5 * 8 / 1e9 < 45


# --- the gate ---------------------------------------------------------------------------------


def good_pairs():
    return [PairResult("demo-0", f"demo-{i}", {1: 0.95, 4: 0.96}) for i in (1, 2, 3)]


def test_gate_passes_at_the_tier():
    gate = evaluate_gate(1, 0.95, 256 * MiB, good_pairs())
    assert gate.passed and gate.reasons == [] and gate.threshold_gbps == pytest.approx(0.8)


def test_gate_passes_exactly_at_the_threshold():
    assert evaluate_gate(10, 8.0, 256 * MiB, [PairResult("a-0", "a-1", {1: 8.0})]).passed


def test_gate_names_the_slow_node_and_its_numbers():
    pairs = good_pairs()
    pairs[1] = PairResult("demo-0", "demo-2", {1: 0.24, 4: 0.238})
    gate = evaluate_gate(1, 0.23, 256 * MiB, pairs)
    assert not gate.passed
    assert gate.reasons[0] == ("node demo-2: p2p 0.24 Gbit/s to demo-0 is below 0.80 x 1 Gbit/s "
                               "(1 stream 0.24, 4 streams 0.24)")
    assert gate.reasons[1] == "all-reduce busbw 0.23 Gbit/s at 256 MiB is below 0.80 x 1 Gbit/s; slow: demo-2"
    assert not any("demo-1" in r or "demo-3" in r for r in gate.reasons)


def test_gate_fails_on_busbw_alone():
    gate = evaluate_gate(10, 7.5, 64 * MiB, [PairResult("a-0", "a-1", {1: 9.4})], min_fraction=0.8)
    assert not gate.passed
    assert gate.reasons == ["all-reduce busbw 7.50 Gbit/s at 64 MiB is below 0.80 x 10 Gbit/s"]


def test_gate_pair_uses_the_best_stream_count():
    # One flow held back by its window while 4 streams fill the link: the link is fine.
    assert evaluate_gate(10, 9.0, 256 * MiB, [PairResult("a-0", "a-1", {1: 5.0, 4: 9.3})]).passed


def test_gate_min_fraction():
    pairs = [PairResult("a-0", "a-1", {1: 0.85})]
    assert evaluate_gate(1, 0.85, 256 * MiB, pairs, min_fraction=0.8).passed
    gate = evaluate_gate(1, 0.85, 256 * MiB, pairs, min_fraction=0.9)
    assert not gate.passed and "below 0.90 x 1 Gbit/s" in gate.reasons[0]


def test_gate_fails_on_a_p2p_error():
    gate = evaluate_gate(1, 0.95, 256 * MiB, [PairResult("a-0", "a-1", error="connection refused")])
    assert gate.reasons == ["node a-1: p2p to a-0 failed: connection refused"]


def test_gate_single_node_has_no_link_to_judge():
    assert evaluate_gate(1, 0.0, 256 * MiB, [], nnodes=1).passed


def test_quick_measures_one_size_the_tier_makes_rate_bound():
    from fatpipe.ops.net.options import quick_size

    assert NetcheckOptions().sizes(4, 1) == (MiB, 256 * MiB)  # the sweep, whatever the tier
    assert NetcheckOptions(quick=True).sizes(4, 1) == (32 * MiB, 32 * MiB)
    # One all-reduce lasts at least a quarter second at the tier, so latency is < 1% of it.
    for nnodes in (2, 3, 4, 8, 64):
        for tier in (1, 10, 25):
            size = quick_size(nnodes, tier)
            seconds = size * (2 * (nnodes - 1) / nnodes) * 8 / (tier * 1e9)
            assert size == 256 * MiB or seconds >= 0.25, (nnodes, tier, size)
            assert size == MiB or seconds / 2 < 0.25 * 1.01  # and no larger than that asks
    assert quick_size(4, 10) == quick_size(4, 25) == 256 * MiB  # never beyond the sweep's largest
    assert NetcheckOptions(quick=True, max_size=MiB).sizes(4, 1) == (MiB, MiB)
    assert NetcheckOptions(quick=True, min_size=4 * MiB).sizes(4, 1) == (4 * MiB, 32 * MiB)  # a sweep when asked
    assert NetcheckOptions(quick=True, min_size=64 * MiB).sizes(4, 1) == (64 * MiB, 64 * MiB)


def quick_plan(options: NetcheckOptions, nnodes: int = 4) -> list[tuple[int, int, int]]:
    """(size, warm-up, timed) for each all-reduce size netbench would run with these options."""
    out = outputs()
    assert len(out.nodes) == nnodes and out.tier_gbps == 1
    args = nb.parse_args(options.netbench_args(out, "x.json")[2:])
    return [(size, *nb.iterations(size, args.quick)) for size in nb.sweep_sizes(args.min_size, args.max_size)]


def test_quick_plan_moves_a_fraction_of_the_sweeps_bytes_at_the_gated_size():
    quick, full = quick_plan(NetcheckOptions(quick=True)), quick_plan(NetcheckOptions())
    assert quick == [(32 * MiB, 1, 4)]  # one size, large enough that the link's rate sets its time
    moved = {name: sum(size * (warmup + timed) for size, warmup, timed in plan)
             for name, plan in (("quick", quick), ("full", full))}
    assert moved["quick"] * 10 <= moved["full"]
    options = NetcheckOptions(quick=True)
    assert options.estimate_s(4, 1) < NetcheckOptions().estimate_s(4, 1)


def test_quick_p2p_runs_once_per_node_with_many_streams():
    from fatpipe.trainer.net.toserver import p2p_stream_counts

    quick = nb.parse_args(NetcheckOptions(quick=True, streams=4).netbench_args(outputs(), "x.json")[2:])
    full = nb.parse_args(NetcheckOptions(streams=4).netbench_args(outputs(), "x.json")[2:])
    assert (p2p_stream_counts(quick), p2p_stream_counts(full)) == ([4], [1, 4])
    assert p2p_stream_counts(nb.parse_args(["--out", "x", "--quick"])) == [1, 4]  # netbench's own --quick keeps both


def test_options_validate():
    from fatpipe.infra.errors import FatpipeError

    with pytest.raises(FatpipeError, match="min fraction"):
        NetcheckOptions(min_fraction=0)
    with pytest.raises(FatpipeError, match="below min size"):
        NetcheckOptions(min_size=4 * MiB, max_size=MiB)


# --- netcheck.json, the table and the plot from a recorded benchmark -------------------------


def outputs(n=4, tier=1):
    return parse_outputs({
        "name": "demo", "provider": "sim", "tier_gbps": tier, "private_cidr": "10.61.0.0/24",
        "nodes": [{"name": f"demo-{i}", "private_ip": f"10.61.0.{10 + i}", "transport": "netns",
                   "netns": f"fp-demo-{i}"} for i in range(n)],
    })


def bench(busbw_256=0.95, slow_ip=None, slow_gbps=0.24, n=4):
    sizes = nb.sweep_sizes(MiB, 256 * MiB)
    rows = []
    for size in sizes:
        gbps = busbw_256
        seconds = size * 8 * nb.bus_factor(n) / (gbps * 1e9)
        rows.append(nb.sweep_row(size, seconds, n, *nb.iterations(size)))
    results = []
    for i in range(1, n):
        ip = f"10.61.0.{10 + i}"
        for streams in (1, 4):
            gbps = slow_gbps if ip == slow_ip else 0.95
            results.append({"server_ip": "10.61.0.10", "client_ip": ip, "streams": streams,
                            "gbps": gbps, "tool": "iperf3"})
    return {"backend": "gloo", "world_size": n, "nnodes": n, "allreduce": rows,
            "busbw_gbps": rows[-1]["busbw_gbps"], "busbw_size": rows[-1]["size"],
            "latency_s": 3e-4, "latency_bytes": 4, "elapsed_s": 50.0,
            "p2p": {"tool": "iperf3", "server_ip": "10.61.0.10", "port": 29401, "seconds": 3.0,
                    "streams": [1, 4], "results": results}}


def test_netcheck_doc_has_what_comm_auto_reads():
    doc = netcheck_doc(bench(), outputs(), NetcheckOptions())
    assert doc["busbw_gbps"] == pytest.approx(0.95) and doc["busbw_size"] == 256 * MiB
    assert doc["latency_s"] == 3e-4 and doc["world_size"] == 4
    assert doc["gate"]["passed"] and doc["gate"]["enforced"]
    assert [p["client"] for p in doc["p2p"]["pairs"]] == ["demo-1", "demo-2", "demo-3"]
    assert doc["p2p"]["server"] == "demo-0"
    json.dumps(doc)  # plain JSON


def test_netcheck_doc_names_the_slow_node_by_its_ip():
    doc = netcheck_doc(bench(busbw_256=0.23, slow_ip="10.61.0.12"), outputs(), NetcheckOptions())
    assert not doc["gate"]["passed"]
    assert doc["gate"]["reasons"][0].startswith("node demo-2: p2p 0.24 Gbit/s to demo-0 is below")


def test_single_flow_is_reported_against_multi_flow():
    """A provider that caps one flow (AWS: 10 Gbit/s) shows as single-flow below multi-flow."""
    doc = bench(n=3)
    for r in doc["p2p"]["results"]:
        r["gbps"] = 0.4 if r["streams"] == 1 else 0.9
    p2p = netcheck_doc(doc, outputs(n=3), NetcheckOptions())["p2p"]
    assert (p2p["single_flow_gbps"], p2p["multi_flow_gbps"]) == (0.4, 0.9)


def test_pairs_keep_a_failed_stream_count_out():
    p2p = bench()["p2p"]
    p2p["results"][1] = {**p2p["results"][1], "error": "timed out", "gbps": None}
    pairs = pairs_from_bench(p2p, {"10.61.0.10": "demo-0", "10.61.0.11": "demo-1"})
    assert pairs[0].gbps_by_streams == {1: 0.95} and pairs[0].error is None


def test_table_and_plot(tmp_path):
    from rich.console import Console

    from fatpipe.cli.render import netcheck_tables
    from fatpipe.ops.net.plot import plot_busbw

    doc = netcheck_doc(bench(busbw_256=0.23, slow_ip="10.61.0.12"), outputs(), NetcheckOptions())
    buf = io.StringIO()
    netcheck_tables(doc, Console(file=buf, width=100))
    text = buf.getvalue()
    assert "256 MiB" in text and "demo-2" in text and "netcheck failed" in text
    png = plot_busbw(doc, tmp_path / "netcheck.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the command, with the benchmark replaced by a recorded one -------------------------------


@pytest.fixture
def deployed(project_dir, monkeypatch):
    """A fake deployed cluster; `use(bench)` decides what the benchmark returns."""
    (project_dir / "fatpipe.toml").write_text(
        '[clusters.demo]\nprovider = "sim"\nnodes = 4\nprivate_cidr = "10.61.0.0/24"\n')
    state = project_dir / ".fatpipe" / "demo"
    state.mkdir(parents=True)
    (state / "outputs.json").write_text(json.dumps(outputs().model_dump(mode="json")))
    seen = {}

    def use(result):
        def fake(cluster, run_dir, options, sink=None, remote_python=None, refuse_running=False):
            seen["options"] = options
            return result
        monkeypatch.setattr("fatpipe.ops.net.check.launch_netbench", fake)  # the sweep's torchrun job
        monkeypatch.setattr("fatpipe.ops.net.check.quick_netbench", fake)  # --quick: the program without torch
        return seen

    return use


def test_cli_passes(run_cli, project_dir, deployed):
    deployed(bench())
    result = run_cli("netcheck", "demo")
    assert result.exit_code == 0, result.output
    assert "netcheck passed" in result.output
    [doc_path] = list((project_dir / ".fatpipe/demo/runs").glob("*/netcheck.json"))
    assert json.loads(doc_path.read_text())["gate"]["passed"]
    assert (doc_path.parent / "netcheck.png").exists()


def test_cli_exits_1_naming_the_slow_node(run_cli, deployed):
    deployed(bench(busbw_256=0.23, slow_ip="10.61.0.12"))
    result = run_cli("netcheck")
    assert result.exit_code == 1
    assert "Error: netcheck failed: node demo-2: p2p 0.24 Gbit/s to demo-0 is below 0.80 x 1 Gbit/s" in result.output


def test_cli_no_gate_reports_and_exits_0(run_cli, deployed):
    deployed(bench(busbw_256=0.23, slow_ip="10.61.0.12"))
    result = run_cli("netcheck", "--no-gate")
    assert result.exit_code == 0
    assert "not enforced" in result.output and "demo-2" in result.output


def test_cli_options_reach_the_benchmark(run_cli, deployed):
    seen = deployed(bench())
    result = run_cli("netcheck", "--min-fraction", "0.9", "--max-size", "16M", "--quick", "--streams", "8",
                     "--timeout", "900")
    assert result.exit_code == 0, result.output
    opts = seen["options"]
    assert (opts.min_fraction, opts.max_size, opts.quick, opts.streams, opts.timeout_s) == (0.9, 16 * MiB, True, 8, 900)
    args = opts.netbench_args(outputs(), "x.json")
    assert args[:2] == ["-m", "fatpipe.trainer.net.bench"] and "--quick" in args
    assert args[args.index("--p2p-server") + 1] == "10.61.0.10"
    assert args[args.index("--p2p-port") + 1] == "29401"


def test_cli_without_outputs_says_deploy_first(run_cli, project_dir):
    (project_dir / "fatpipe.toml").write_text('[clusters.demo]\nprovider = "sim"\n')
    result = run_cli("netcheck")
    assert result.exit_code == 1 and "deploy" in result.output


def test_cli_refuses_a_bad_size(run_cli):
    result = run_cli("netcheck", "--max-size", "lots")
    assert result.exit_code == 2 and "not a size" in result.output


def test_a_benchmark_past_its_bound_names_the_seconds_and_the_options(project_dir, monkeypatch):
    """The bound given (`--timeout`) is what the launch follows for, and its end names both options."""
    from types import SimpleNamespace

    from fatpipe.infra.errors import FatpipeError
    from fatpipe.infra.project import load_project
    from fatpipe.ops.net.check import launch_netbench

    (project_dir / "fatpipe.toml").write_text('[clusters.demo]\nprovider = "sim"\nnodes = 4\n'
                                              'private_cidr = "10.61.0.0/24"\n')
    monkeypatch.setattr("fatpipe.ops.net.check.ask_launch_checks", lambda *a, **k: None)
    monkeypatch.setattr("fatpipe.ops.net.check.require_firewall", lambda *a, **k: [])
    followed = []

    def launch(cluster, rdzv, bench_dir, sink, follow):
        followed.append(follow.timeout_s)
        return SimpleNamespace(ok=False, timed_out=True, interrupted=False, exit_codes={}, exit_code=124)

    monkeypatch.setattr("fatpipe.ops.net.check.launch", launch)
    project = load_project(project_dir / "fatpipe.toml")
    with pytest.raises(FatpipeError, match=r"timed out after 42 s \(`netcheck --timeout` or `up --netcheck-timeout`") as e:
        launch_netbench(Cluster.resolve(project, "demo", outputs()), project_dir / "run", NetcheckOptions(timeout_s=42))
    assert followed == [42] and e.value.exit_code == 124
