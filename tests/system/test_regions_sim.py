"""Two regions on real shaped links (root): a 4-node 10g sim cluster in two regions joined by one
0.2 Gbit/s link that caps each flow at 0.05. netcheck --pairs finds the two regions and the
per-flow cap; a run with DiLoCo between regions sends its per-step all-reduce over the links
inside each region and only its int8 outer exchange over the link between them (counted by the
link's own counters), against a flat ring that crosses at every step; its decision line names
both levels."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import netns_available, skip_or_fail

CLUSTER = "rg-sys"
CIDR = "10.232.0.0/24"
NODES = [f"{CLUSTER}-{i}" for i in range(4)]
STEPS, H = 30, 10
CROSS_GBIT, FLOW_GBIT = 0.2, 0.05  # the link between the regions, and its cap on one flow
TRAIN = ["--preset", "tiny", "--batch-size", "4", "--seq-len", "64", "--steps", str(STEPS),
         "--warmup-steps", "3", "--eval-windows", "8", "--checkpoint-every", str(STEPS), "--comm", "none",
         "--max-restarts", "0", "--remote-python", sys.executable]

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.timeout(900)]


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("FATPIPE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture(scope="module")
def two_regions(tmp_path_factory):
    if not netns_available():
        skip_or_fail("needs root and `ip netns`")
    if not shutil.which("terraform"):
        skip_or_fail("terraform is not installed")
    root = tmp_path_factory.mktemp("regions")
    (root / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = 4\ntier = "10g"\nisolation = "netns"\n'
        f'private_cidr = "{CIDR}"\nregions = 2\ncross_region_gbps = {CROSS_GBIT}\n'
        f'cross_region_flow_gbps = {FLOW_GBIT}\n')
    try:
        deployed = fatpipe(root, "deploy", CLUSTER, "--yes")
        assert deployed.returncode == 0, deployed.stdout
        yield root
    finally:
        down = fatpipe(root, "down", CLUSTER)
        assert down.returncode == 0, down.stdout
        from fatpipe.stacks.sim.net import cluster_digest

        left = [name for name in os.listdir("/sys/class/net") if cluster_digest(CLUSTER) in name]
        assert not left, f"down left {left}"


def crossed() -> int:
    """Bytes that left either region through its uplink so far."""
    from fatpipe.stacks.sim.net import cluster_digest
    from fatpipe.stacks.sim.regions import crossed_bytes

    return sum(c["out"] for c in crossed_bytes(cluster_digest(CLUSTER), 2).values())


def node_bytes(index: int) -> int:
    """Bytes node `index`'s own veth carried both ways (inside its region or not)."""
    from fatpipe.stacks.sim.net import link_names

    stats = Path("/sys/class/net", link_names(CLUSTER, index)["host_if"], "statistics")
    return sum(int((stats / f).read_text()) for f in ("tx_bytes", "rx_bytes"))


def test_netcheck_finds_the_regions_and_the_per_flow_cap(two_regions):
    outputs = json.loads((two_regions / f".fatpipe/{CLUSTER}/outputs.json").read_text())
    assert [n["region"] for n in outputs["nodes"]] == ["r0", "r0", "r1", "r1"]
    assert outputs["cross_region_gbps"] == CROSS_GBIT
    done = fatpipe(two_regions, "netcheck", CLUSTER, "--pairs", "--quick", "--max-size", "4M")
    doc = json.loads(max((two_regions / f".fatpipe/{CLUSTER}/runs").glob("*/netcheck.json")).read_text())
    regions = doc["regions"]
    assert regions["groups"] == [NODES[:2], NODES[2:]], (regions, done.stdout)
    assert regions["contradicts"] == [] and regions["ratio"] >= regions["k"]
    # One flow between regions is held to its cap; several fill more of the link: a run over
    # these links splits the exchange between regions over 4 connections per shard.
    from fatpipe.ops.rdzv.regionenv import flow_rates

    one, many = flow_rates(doc, {name: f"r{i // 2}" for i, name in enumerate(NODES)})
    # (Several, not all four: on a loaded machine the 4 flows share fewer classes or CPU.)
    assert one < 1.4 * FLOW_GBIT and many >= 1.8 * one, (one, many)
    assert "r0" in done.stdout and "r1" in done.stdout, done.stdout


def run(root: Path, cross_comm: str) -> tuple[dict, str, int, int]:
    """A run's summary, log, bytes that crossed between regions and node 0's own bytes."""
    crossed_before, node_before = crossed(), node_bytes(0)
    done = fatpipe(root, "launch", CLUSTER, *TRAIN, "--cross-comm", cross_comm, "--sync-every", str(H))
    assert done.returncode == 0, done.stdout[-4000:]
    runs = root / f".fatpipe/{CLUSTER}/runs"
    summary = json.loads((runs / (runs / "latest").read_text().strip() / "summary.json").read_text())
    return summary, done.stdout, crossed() - crossed_before, node_bytes(0) - node_before


def test_diloco_between_regions_crosses_only_its_int8_exchange(two_regions):
    flat, _, flat_crossed, _ = run(two_regions, "flat")
    hier, log, hier_crossed, hier_node = run(two_regions, "diloco")
    assert "between regions diloco every 10 steps, int8" in log and "inside each region none" in log, log[-3000:]
    assert "fault tolerance: restart" in log
    assert hier["replicas_in_sync"] and hier["regions"]["regions"] == ["r0", "r1"]
    params = hier["params"]
    syncs = STEPS // H
    # Each sync, each region's pseudo-gradient crosses once as int8 (and its scales): about
    # params bytes each way per sync, where the flat ring crossed float32 gradients every step.
    assert hier_crossed < 3 * syncs * params, (hier_crossed, syncs, params)
    assert flat_crossed > 10 * hier_crossed, (flat_crossed, hier_crossed)
    # The per-step all-reduce still ran, inside the region: node 0's own link carried it.
    assert hier_node > STEPS * 4 * params, (hier_node, params)
    assert abs(hier["eval_loss"] - flat["eval_loss"]) < 0.5, (hier["eval_loss"], flat["eval_loss"])


def test_live_with_diloco_between_the_regions_is_refused_before_anything_starts(two_regions):
    """fault_tolerance = "live" never opens the regions: named with DiLoCo between them on this
    cluster's regions, the launch refuses in one line naming both keys (exit 2), no run left."""
    runs = two_regions / f".fatpipe/{CLUSTER}/runs"
    before = sorted(p.name for p in runs.iterdir()) if runs.exists() else []
    done = fatpipe(two_regions, "launch", CLUSTER, *TRAIN, "--fault-tolerance", "live", "--cross-comm", "diloco")
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout[-3000:]
    assert 'fault_tolerance = "live" with cross_comm = "diloco" across regions (r0, r1)' in lines[0], lines
    assert (sorted(p.name for p in runs.iterdir()) if runs.exists() else []) == before
