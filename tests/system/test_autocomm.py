"""comm=auto re-decides mid-run: a real rate cut on a netns sim cluster, and exact resume across a switch.

The cut: a 3-node sim cluster at 1 Gbit/s starts `fatpipe launch --comm auto`; once a few steps
are logged, every link is cut to 20 Mbit/s with `reshape_node`. The run must switch hooks once,
within two checkpoint intervals of the cut, and end with its replicas in sync.

The resume: two local processes whose netcheck.json claims a 2 Mbit/s link, so auto starts on
PowerSGD (one DDP bucket on gloo); loopback is far faster, the step stays far below the
prediction, the re-probe finds plain all-reduce best and the run switches (DDP rebuilt with its
own bucket layout). A copy of the run resumed from the switch's checkpoint must end with the
same parameters as the uninterrupted run.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import faults
import pytest
from midrun import CUT_GBIT, launch_and_cut

from fatpipe.trainer.checkpoint import list_checkpoints
from fatpipe.trainer.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

TINY = ["--preset", "tiny", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "3",
        "--timeout-s", "120"]
RUN_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out: Path, *args: str) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
           "-m", "fatpipe.trainer", *TINY, "--out", str(out), *args]
    done = subprocess.run(cmd, env={**faults.cli_env(), "GLOO_SOCKET_IFNAME": "lo"}, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def test_a_run_resumed_from_a_switch_ends_as_the_uninterrupted_run(tmp_path):
    straight = tmp_path / "straight"
    straight.mkdir()
    (straight / "netcheck.json").write_text(
        json.dumps({"busbw_gbps": 0.002, "latency_s": 1e-4, "world_size": 2}))
    # Compute well above the hooks' own cost, so on loopback plain all-reduce fits the budget.
    flags = ["--steps", "16", "--checkpoint-every", "4", "--comm", "auto", "--bucket-cap-mb",
             "0.25", "--batch-size", "8", "--seq-len", "128"]
    output = torchrun(straight, *flags)
    assert "comm=auto chose powersgd" in output and "switched powersgd -> none" in output
    s = json.loads((straight / "summary.json").read_text())
    assert s["comm"] == "none" and s["comm_switches"] == 1 and s["replicas_in_sync"]
    switch = s["comm_decision"]["switches"][0]
    assert switch["from"] == "powersgd" and switch["to"] == "none" and switch["step"] < 16
    assert switch["pause_s"] > 0
    assert s["comm_prediction"]["comm"] == "none" and s["comm_prediction"]["error"] is not None
    records = read_metrics(straight / "metrics.jsonl")
    assert [r["comm"] for r in records] == ["powersgd"] * switch["step"] + \
        ["none"] * (16 - switch["step"])
    assert any(r["prediction_error"] is not None for r in records)
    assert all(r["wire_bytes"] == r["grad_bytes"] for r in records[switch["step"]:])

    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    for step, path in list_checkpoints(resumed / "checkpoints"):
        if step > switch["step"]:
            path.unlink()
    (resumed / "summary.json").unlink()
    output = torchrun(resumed, *flags)
    assert "keeping none from the checkpoint" in output
    r = json.loads((resumed / "summary.json").read_text())
    assert r["param_digests"] == s["param_digests"] and r["steps"] == 16
    assert r["comm_switches"] == 1


# -- the mid-run cut on a netns sim cluster -------------------------------------------------

NAME, OCTET = "accut", 118
NODES, STEPS, EVERY, CUT_AFTER = 3, 30, 5, 7


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from faults.deployed_sim_cluster(tmp_path_factory, NAME, OCTET, nodes=NODES)


def test_auto_switches_once_after_a_mid_run_cut(cluster):
    # Batches large enough that plain all-reduce fits the budget at 1 Gbit/s: the run starts on
    # a DDP hook (mid-run switches are between DDP hooks).
    run, cut_at, _ = launch_and_cut(
        cluster, NAME, NODES,
        [*TINY, "--batch-size", "16", "--seq-len", "128", "--steps", str(STEPS),
         "--checkpoint-every", str(EVERY), "--comm", "auto", "--max-restarts", "0",
         "--fault-tolerance", "restart",  # a re-decision mid-run: restart's comm=auto
         "--timeout", str(RUN_TIMEOUT_S + 60)],
        CUT_AFTER, RUN_TIMEOUT_S)
    s = json.loads((run / "summary.json").read_text())
    assert s["replicas_in_sync"] and s["steps"] == STEPS
    assert s["comm_switches"] == 1, json.dumps(s["comm_decision"], indent=1)
    switch = s["comm_decision"]["switches"][0]
    assert cut_at < switch["step"] <= cut_at + 2 * EVERY
    assert switch["to"] != switch["from"] and switch["busbw_gbps"] < 2.5 * CUT_GBIT
    records = read_metrics(run / "metrics.jsonl")
    assert {r["comm"] for r in records[switch["step"]:]} == {switch["to"]}
