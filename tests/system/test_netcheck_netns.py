"""netcheck on real shaped links (root): the p2p tool between two namespaces, and the whole check on a
4-node sim cluster at 1 Gbit/s, once as deployed and once with one node's link cut to a quarter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import netns_available, skip_or_fail

from fatpipe.ops.reach.cluster import Cluster

CLUSTER = "t-net-sim"
CIDR = "10.61.0.0/24"
PAIR = ("fp-t-net-p2p-a", "fp-t-net-p2p-b")  # two namespaces joined by one veth pair
PAIR_IPS = ("10.61.1.1", "10.61.1.2")
TIER_GBIT = 1.0  # the rate every link here is shaped to (the 1g tier)
SLOW_GBIT = TIER_GBIT / 4  # one node's, cut to a quarter

pytestmark = [pytest.mark.root]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def shape(dev: str, rate_gbit: float, netns: str | None = None) -> None:
    """Replace the root qdisc of `dev` with a tbf at `rate_gbit`, as the sim shapes its links."""
    from fatpipe.stacks.sim.links import tbf_args

    sh(*(["tc"] + (["-n", netns] if netns else []) + ["qdisc", "replace", "dev", dev, "root"]
         + tbf_args(rate_gbit)))


# --- the p2p tool between two namespaces ------------------------------------------------------


@pytest.fixture
def netns_pair(needs_netns):
    a, b = PAIR
    for ns in PAIR:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    sh("ip", "netns", "add", a)
    sh("ip", "netns", "add", b)
    try:
        sh("ip", "link", "add", "p2p-a", "netns", a, "type", "veth", "peer", "name", "p2p-b", "netns", b)
        for ns, dev, ip in ((a, "p2p-a", PAIR_IPS[0]), (b, "p2p-b", PAIR_IPS[1])):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            shape(dev, TIER_GBIT, netns=ns)
        yield
    finally:
        for ns in PAIR:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.parametrize("tool", ["socket", "iperf3"])
def test_p2p_tool_between_two_namespaces_at_1g(netns_pair, tool):
    import shutil

    if tool == "iperf3" and not shutil.which("iperf3"):
        skip_or_fail("iperf3 is not installed")
    a, b = PAIR
    port = "5299"
    server_cmd = ["ip", "netns", "exec", a, sys.executable, "-m", "fatpipe.trainer.net.p2p", "server",
                  "--bind", PAIR_IPS[0], "--port", port, "--tool", tool, "--idle-timeout", "60"]
    server = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        results = []
        for streams in ("1", "4"):
            out = subprocess.run(
                ["ip", "netns", "exec", b, sys.executable, "-m", "fatpipe.trainer.net.p2p", "client",
                 "--connect", PAIR_IPS[0], "--bind", PAIR_IPS[1], "--port", port, "--tool", tool,
                 "--streams", streams, "--seconds", "2"],
                capture_output=True, text=True, timeout=60, check=True).stdout
            results.append(json.loads(out))
    finally:
        server.terminate()
        server.wait(timeout=10)
    for r in results:
        assert r["tool"] == tool
        # tbf shapes the wire rate; TCP/IP headers leave ~95 % of it as goodput.
        assert 0.88 * TIER_GBIT <= r["gbps"] <= TIER_GBIT, results


# --- the whole check on a sim cluster ---------------------------------------------------------


@pytest.fixture(scope="module")
def sim_cluster(tmp_path_factory):
    """A deployed 4-node 1g sim cluster in netns isolation; destroyed after the module."""
    if not netns_available():
        skip_or_fail("needs root and `ip netns`")
    import shutil

    if not shutil.which("terraform"):
        skip_or_fail("terraform is not installed")
    from fatpipe.infra.project import load_project
    from fatpipe.stacks.engine import deploy_cluster, destroy_cluster

    root = tmp_path_factory.mktemp("netcheck-sim")
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = 4\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "{CIDR}"\n')
    project = load_project(root / "fatpipe.toml")
    try:
        outputs = deploy_cluster(project, project.cluster(CLUSTER))
        yield project, outputs
    finally:
        destroy_cluster(project, project.cluster(CLUSTER))


@pytest.mark.slow
def test_sim_cluster_at_1g_passes_with_real_numbers(sim_cluster):
    from fatpipe.ops.net.check import NetcheckOptions, run_netcheck

    project, outputs = sim_cluster
    # TCP over a 1500-byte MTU carries at most 1448/1514 = 0.956 of the wire rate; plain gloo
    # gets ~0.95 on an idle machine. Other processes on these 2 cores cost all-reduce a few %
    # (0.85-0.93 measured beside the suite's other lane; 0.76 once when three lanes shared the
    # cores), and the load average lags. So the gate here is at `bar`, not the product's 0.8 for an
    # idle node: it tells real numbers from a wrong formula (algbw for busbw would read 2/3 of the
    # figure at 4 nodes, at most 0.64), not the machine's load; bench/netcheck_sim.py measures the
    # real figure.
    bar = 0.7 * TIER_GBIT
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    doc = run_netcheck(Cluster.resolve(project, CLUSTER, outputs), options=NetcheckOptions(min_fraction=bar))
    elapsed = time.monotonic() - started
    report = (f"busbw {[round(r['busbw_gbps'], 3) for r in doc['allreduce']]}, p2p "
              f"{[(p['client'], p['gbps_by_streams']) for p in doc['p2p']['pairs']]}, {elapsed:.0f} s, "
              f"load average {load_before:.1f} before the run")
    print(report)
    assert doc["gate"]["passed"] and doc["gate"]["threshold_gbps"] == bar, doc["gate"]
    assert doc["busbw_size"] == 256 << 20 and doc["world_size"] == 4 and doc["backend"] == "gloo"
    assert doc["busbw_gbps"] >= bar, report
    assert all(p["best_gbps"] >= 0.9 * TIER_GBIT for p in doc["p2p"]["pairs"]), report
    assert doc["busbw_gbps"] <= TIER_GBIT  # tbf cannot be beaten: a larger number means a wrong formula
    run_dir = next((project.root / f".fatpipe/{CLUSTER}/runs").glob("*/netcheck.json")).parent
    assert (run_dir / "netcheck.json").exists() and (run_dir / "netcheck.png").exists()


@pytest.mark.slow
def test_a_node_at_a_quarter_of_the_tier_is_named(sim_cluster):
    from fatpipe.ops.net.check import NetcheckFailed, NetcheckOptions, run_netcheck
    from fatpipe.stacks.sim.net import reshape_node

    project, outputs = sim_cluster
    slow = f"{CLUSTER}-2"
    reshape_node(CLUSTER, 2, SLOW_GBIT)
    try:
        with pytest.raises(NetcheckFailed) as failed:
            run_netcheck(Cluster.resolve(project, CLUSTER, outputs),
                         options=NetcheckOptions(max_size=16 << 20, quick=True))
    finally:
        reshape_node(CLUSTER, 2, TIER_GBIT)
    doc = failed.value.doc
    assert failed.value.exit_code == 1
    # The quick check's plan on real nodes: the one size asked for, one multi-stream run per node.
    assert [row["size"] for row in doc["allreduce"]] == [16 << 20] and doc["p2p"]["streams"] == [4]
    pair_reasons = [r for r in doc["gate"]["reasons"] if r.startswith("node ")]
    assert len(pair_reasons) == 1 and pair_reasons[0].startswith(f"node {slow}: p2p 0.2"), doc["gate"]
    assert f"node {slow}" in str(failed.value)
    by_node = {p["client"]: p["best_gbps"] for p in doc["p2p"]["pairs"]}
    assert 0.8 * SLOW_GBIT <= by_node[slow] <= 1.04 * SLOW_GBIT, by_node
    assert all(g >= 0.9 * TIER_GBIT for n, g in by_node.items() if n != slow), by_node
    assert doc["busbw_gbps"] < 1.2 * SLOW_GBIT  # the ring runs at the speed of its slowest link
