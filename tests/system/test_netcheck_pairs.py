"""`fatpipe netcheck --pairs` on real shaped links (root): a 4-node 1g sim cluster with one node's
link cut to a quarter of the tier; the command names the three links that touch it, and only those.
And netbench --pairs under torchrun on three loopback addresses (no root): an odd node count,
where each round leaves one node out."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import netns_available, skip_or_fail

CLUSTER = "np-pairs"
CIDR = "10.72.0.0/24"
SLOW = 1  # the node whose link is shaped to a quarter of the tier
SLOW_GBIT = 0.25  # its rate: a quarter of the 1g tier

pytestmark = pytest.mark.slow
JOIN_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fatpipe(folder: Path, *args: str, timeout: float = 540) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("FATPIPE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture(scope="module")
def slow_node_cluster(tmp_path_factory):
    """A deployed 4-node 1g netns sim cluster, node SLOW reshaped to 0.25 Gbit/s; down after."""
    if not netns_available():
        skip_or_fail("needs root and `ip netns`")
    if not shutil.which("terraform"):
        skip_or_fail("terraform is not installed")
    root = tmp_path_factory.mktemp("netcheck-pairs")
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = 4\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "{CIDR}"\n')
    try:
        deployed = fatpipe(root, "deploy", CLUSTER, "--yes")
        assert deployed.returncode == 0, deployed.stdout
        from fatpipe.stacks.sim.net import reshape_node

        reshape_node(CLUSTER, SLOW, SLOW_GBIT)
        yield root
    finally:
        down = fatpipe(root, "down", CLUSTER)
        assert down.returncode == 0, down.stdout


@pytest.mark.root
def test_pairs_name_the_three_links_of_the_slow_node(slow_node_cluster):
    root = slow_node_cluster
    done = fatpipe(root, "netcheck", CLUSTER, "--pairs", "--quick", "--max-size", "4M")
    assert done.returncode == 1, done.stdout  # the gate fails, naming the links
    doc = json.loads(next((root / f".fatpipe/{CLUSTER}/runs").glob("*/netcheck.json")).read_text())
    pairs = doc["pairs"]
    names = [f"{CLUSTER}-{i}" for i in range(4)]
    slow = names[SLOW]
    report = [(link["a"], link["b"], round(link["best_gbps"], 3), link["rtt_p50_s"], link["jitter_s"])
              for link in pairs["links"]]

    # Every unordered pair once, in 3 rounds of 2 pairs that share no node.
    assert sorted((link["a"], link["b"]) for link in pairs["links"]) == [
        (names[i], names[j]) for i in range(4) for j in range(i + 1, 4)], report
    assert len(pairs["rounds"]) == 3
    for round_ in pairs["rounds"]:
        assert len(round_) == 2 and len({node for pair in round_ for node in pair}) == 4
    assert all(link["error"] is None for link in pairs["links"]), report
    # A round trip of a small message, not of the throughput test: the 50 of them take less
    # than one throughput test lasts.
    seconds = pairs["seconds"]
    assert all(0 < link["rtt_p50_s"] <= link["rtt_p95_s"] and link["rtt_count"] * link["rtt_p50_s"] < seconds
               and link["jitter_s"] >= 0 for link in pairs["links"]), (report, seconds)

    # The three links touching the slow node are the three worst, at about a quarter of the tier
    # (tbf's wire rate less TCP/IP headers); the other three pass the bar.
    touching = sorted(pairs["links"], key=lambda link: link["best_gbps"])
    assert all(slow in (link["a"], link["b"]) for link in touching[:3]), report
    assert all(0.6 * SLOW_GBIT <= link["best_gbps"] <= 1.04 * SLOW_GBIT for link in touching[:3]), report
    assert not any(link["slow"] for link in touching[3:]), (report, doc["gate"]["reasons"])
    assert slow in (pairs["worst"]["a"], pairs["worst"]["b"])
    assert pairs["slow_node"] == slow
    assert sorted(map(sorted, pairs["slow"])) == sorted(sorted([slow, n]) for n in names if n != slow)

    link_reasons = [r for r in doc["gate"]["reasons"] if r.startswith("link ")]
    assert len(link_reasons) == 3 and all(slow in r for r in link_reasons), doc["gate"]["reasons"]
    # What the terminal shows: the matrix, the worst link and the three slow links by name.
    out = done.stdout
    assert f"worst link: {pairs['worst']['a']} <-> {pairs['worst']['b']}" in out, out
    below = next(line for line in out.splitlines() if line.startswith("links below the bar:"))
    named, touch = below.split(" (all touch ")
    assert named.count(slow) == 3 and touch == f"{slow})", out
    for a, b in pairs["slow"]:
        assert f"link {a} <-> {b}: 0." in out, out


def test_netbench_pairs_on_three_loopback_nodes(tmp_path):
    """Three torchrun agents, each a "node" on its own loopback address: 3 rounds of one pair, every
    pair measured once with throughput and round trips, the result the same on every rank."""
    from fatpipe.trainer.net import bench as nb

    out = tmp_path / "netbench.json"
    master, p2p_port = free_port(), free_port()
    procs = []
    for node in range(3):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "3", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(master),
               "-m", "fatpipe.trainer.net.bench", "--out", str(out), "--min-size", "64K", "--max-size", "64K",
               "--quick", "--timeout-s", "120", "--no-p2p", "--pairs", "--p2p-tool", "socket",
               "--p2p-seconds", "0.5", "--p2p-port", str(p2p_port), "--streams", "2"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "FATPIPE_NODE_NAME": f"lo-{node}",
               "FATPIPE_NODE_RANK": str(node), "FATPIPE_PRIVATE_IP": f"127.0.0.{node + 1}"}
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=JOIN_TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(logs)
    doc = json.loads(out.read_text())
    printed = [line for line in logs[0].splitlines() if line.startswith(nb.RESULT_PREFIX)]
    assert json.loads(printed[0][len(nb.RESULT_PREFIX):]) == doc and doc["p2p"] is None
    pairs = doc["pairs"]
    assert pairs["rounds"] == [[["lo-1", "lo-2"]], [["lo-0", "lo-2"]], [["lo-0", "lo-1"]]]
    assert [(r["a"], r["b"], r["a_ip"], r["b_ip"]) for r in pairs["links"]] == [
        ("lo-0", "lo-1", "127.0.0.1", "127.0.0.2"), ("lo-0", "lo-2", "127.0.0.1", "127.0.0.3"),
        ("lo-1", "lo-2", "127.0.0.2", "127.0.0.3")]
    for r in pairs["links"]:
        assert r["error"] is None and r["tool"] == "socket", r
        assert set(r["gbps_by_streams"]) == {"1", "2"} and all(g > 0 for g in r["gbps_by_streams"].values())
        assert r["rtt_count"] == 50 and 0 < r["rtt_p50_s"] <= r["rtt_p95_s"] < pairs["seconds"]
        assert r["rtt_count"] * r["rtt_p50_s"] < pairs["seconds"], r  # one message's, not all 50
        assert r["jitter_s"] == r["rtt_p95_s"] - r["rtt_p50_s"]
