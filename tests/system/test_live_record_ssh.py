"""A live run's record survives node 0: on a 3-node sim cluster reached over SSH (each node's
project folder of its own, as a disk of its own), node 0 is cut off from its two peers mid-run.
The others train on, node 0 commits nothing alone and heals from a peer when the cut ends, so
its own record has a hole; the run folder `up` pulls and sums up holds every step, the leave at
the step the quorum went on without node 0, and the counts of the survivors' view.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import faults
import pytest

from fatpipe.trainer.metrics import read_metrics

from .conftest import fatpipe_cli, require_ssh_sim, ssh_sim_toml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

NAME, OCTET, NODES = "t-liverec", 189, 3
STEPS, CUT_AT, WITHOUT = 150, 20, 3  # node 0 back once the others took WITHOUT steps alone
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-liverec-")
TRAIN = ["--fault-tolerance", "live", "--max-restarts", "2", "--remote-python", sys.executable,
         "--preset", "tiny", "--steps", str(STEPS), "--batch-size", "8", "--seq-len", "128",
         "--warmup-steps", "3", "--comm", "none", "--eval-windows", "4", "--checkpoint-every", "50"]


def fatpipe(folder: Path, *args: str, timeout: float = 600):
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("liverec")
    (folder / "fatpipe.toml").write_text(ssh_sim_toml(NAME, NODES, OCTET))
    try:
        deployed = fatpipe(folder, "deploy", NAME, "--yes")
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        yield folder
    finally:
        heal()
        fatpipe(folder, "down", NAME, timeout=300)
        from fatpipe.stacks.sim import net as simnet

        simnet.sweep_cluster(NAME, folder / ".fatpipe" / NAME / "nodes")


def outputs(folder: Path) -> dict:
    return json.loads((folder / ".fatpipe" / NAME / "outputs.json").read_text())


def on_node(folder: Path, index: int, run_id: str) -> Path:
    """The run's folder on node `index` (a sim node's project folder lies on this machine)."""
    return Path(outputs(folder)["nodes"][index]["remote_dir"]) / ".fatpipe" / NAME / "runs" / run_id


def cut_off_node_0(peers: list[str]) -> None:
    """Drop every packet between node 0 and its peers, inside node 0 (this machine still reaches it)."""
    rules = ["add table inet liverec",
             "add chain inet liverec input { type filter hook input priority -50; }",
             "add chain inet liverec output { type filter hook output priority -50; }"]
    for ip in peers:
        rules += [f"add rule inet liverec input ip saddr {ip} drop",
                  f"add rule inet liverec output ip daddr {ip} drop"]
    done = subprocess.run(["ip", "netns", "exec", faults.netns_name(NAME, 0), "nft", "-f", "-"],
                          input="\n".join(rules) + "\n", text=True, capture_output=True, timeout=10)
    assert done.returncode == 0, done.stderr


def heal() -> None:
    subprocess.run(["ip", "netns", "exec", faults.netns_name(NAME, 0), "nft", "delete", "table", "inet",
                    "liverec"], capture_output=True, timeout=10)


def test_node_0_cut_off_mid_run_leaves_the_runs_record_whole(cluster):
    runs = cluster / ".fatpipe" / NAME / "runs"
    before = set(runs.glob("2*")) if runs.is_dir() else set()
    out = cluster / "up.out"
    with open(out, "w") as log:
        up = subprocess.Popen([sys.executable, "-m", "fatpipe.cli", "up", NAME, "--netcheck", "off", *TRAIN],
                              cwd=cluster, env=faults.cli_env(FATPIPE_SSH_CONTROL_DIR=CONTROL_DIR),
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        run_id = faults.wait_for("the run's folder", lambda: next(
            (p.name for p in runs.glob("2*") if p not in before and (p / "rendezvous.json").exists()), None), 300)
        own = on_node(cluster, 0, run_id) / "metrics.jsonl"  # node 0's record, on its own disk
        faults.wait_for(f"{CUT_AT} steps", lambda: up.poll() is None and own.exists()
                        and len(own.read_text().splitlines()) >= CUT_AT, 300, every_s=0.2)
        cut_off_node_0([n["private_ip"] for n in outputs(cluster)["nodes"][1:]])
        peer = on_node(cluster, 1, run_id) / "live-node-1" / "metrics.jsonl"
        try:
            faults.wait_for(f"{WITHOUT} steps without node 0", lambda: up.poll() is None and sum(
                r["participants"] == 2 for r in read_metrics(peer)) >= WITHOUT, 300, every_s=0.2)
        finally:
            heal()
        code = up.wait(timeout=1200)
    finally:
        if up.poll() is None:
            up.kill()
            fatpipe(cluster, "stop", NAME, timeout=300)
    text = out.read_text(errors="replace")
    assert code == 0, text[-6000:]
    local = runs / run_id
    node0 = [r["step"] for r in read_metrics(local / "live-node-0" / "metrics.jsonl")]
    assert node0[-1] == STEPS and len(node0) < STEPS, node0  # node 0 was away: its own record has a hole
    survivor = read_metrics(local / "live-node-1" / "metrics.jsonl")
    steps = read_metrics(local / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # the run's: every step once
    without = [r["step"] for r in survivor if r["participants"] == 2]
    assert without and without[0] > CUT_AT - 5, without
    doc = json.loads((local / "summary.json").read_text())
    assert doc["steps"] == STEPS
    leaves = [m["step"] for m in doc["membership"] if m["event"] == "leave"]
    assert leaves and leaves[0] == without[0], (doc["membership"], without)  # when the quorum went on
    assert doc["skipped_batches"] == sum(3 - r["participants"] for r in steps) * doc["batches_per_node_step"]
    assert doc["skipped_batches"] >= len(without)
    assert doc["failed_exchanges"] == sum(r.get("attempts", 1) - 1 for r in steps)
    assert doc["sync_exchanges"] == STEPS + doc["failed_exchanges"]
    assert doc["replicas_in_sync"] is True, doc  # all three ended with the same weights
    flat = " ".join(text.replace("│", " ").split())
    assert f"steps {STEPS}" in flat, text[-4000:]  # what `up` printed is the run's
    joins = sum(1 for m in doc["membership"] if m["event"] == "join")
    assert f"replica groups / leaves / joins 3 / {len(leaves)} / {joins}" in flat, text[-4000:]
    assert "all 3 node(s) exit 0" in flat, text[-4000:]
