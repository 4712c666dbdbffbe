"""comm=auto re-decides mid-run in a user's script (examples/ddp_script.py) on a netns sim cluster.

A 3-node sim cluster at 1 Gbit/s runs `fatpipe launch --comm auto -- examples/ddp_script.py`;
with batches large enough that plain all-reduce fits the budget there (on an idle machine too),
the script starts on a DDP hook that sends the whole gradient. Once a few steps are logged every link is cut to
20 Mbit/s (`reshape_node`, the qdisc replaced in place). The script's steps then stay off the
prediction: every rank re-probes at the same step, the hook is switched in place in the timed
comm hook (the script's DDP stays), and the switch shows in the decision line, summary.json,
metrics.jsonl and the report, as for the built-in trainer (test_autocomm.py).
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import faults
import pytest
from midrun import CUT_GBIT, launch_and_cut

from fatpipe.trainer.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_script.py"
NAME, OCTET, NODES, STEPS, CUT_AFTER = "scr-rd", 197, 3, 40, 6
RUN_TIMEOUT_S = 420
# Compute must dominate the uncut link's all-reduce on an idle machine too (a loaded one only
# adds compute): at 16 sequences an idle step took 54 ms against 21 ms of sync at 1 Gbit/s, so
# auto rightly took powersgd before the cut and had nothing to switch.
BATCH = 48


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    for folder in faults.deployed_sim_cluster(tmp_path_factory, NAME, OCTET, nodes=NODES):
        (folder / "examples").mkdir()
        shutil.copy(EXAMPLE, folder / "examples" / EXAMPLE.name)
        yield folder


def test_a_script_switches_its_hook_after_a_mid_run_cut(cluster):
    run, cut_at, output = launch_and_cut(
        cluster, NAME, NODES,
        ["--comm", "auto", "--warmup-steps", "2", "--max-restarts", "0", "--timeout", str(RUN_TIMEOUT_S + 60),
         "--", "examples/ddp_script.py", "--steps", str(STEPS), "--batch-size", str(BATCH), "--seq-len", "64"],
        CUT_AFTER, RUN_TIMEOUT_S)
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == STEPS and s["preset"] == "script" and s["failed_collectives"] == 0
    decision = s["comm_decision"]
    assert s["comm_switches"] >= 1, json.dumps(decision, indent=1)
    switch = decision["switches"][0]
    first = switch["from"]
    assert first in ("none", "bf16", "fp16") and switch["to"] != first
    assert cut_at < switch["step"] < STEPS and switch["busbw_gbps"] < 2.5 * CUT_GBIT
    assert f"comm=auto switched {first} -> {switch['to']} at step {switch['step']}" in output
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert {r["comm"] for r in records[4:switch["step"]]} == {first}  # decided after step 4
    assert records[switch["step"]]["comm"] == switch["to"]
    assert any(r.get("prediction_error") is not None for r in records)
    assert s["comm_prediction"]["comm"] == s["comm"] == decision["comm"]

    report = faults.fatpipe(cluster, "report", NAME, timeout=120)
    assert report.returncode == 0, report.stdout[-3000:]
    page = (run / "report.html").read_text()
    assert "switches" in page and html.escape(f'"from": "{first}", "to": "{switch["to"]}"') in page
