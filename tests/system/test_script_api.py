"""A user's own DDP script (examples/ddp_script.py, fatpipe.trainer.api) gets what the built-in trainer gets.

Locally: two torchrun processes whose run folder holds a netcheck.json claiming a 2 Mbit/s link;
comm=auto measures the script's first steps and picks a compressing hook, and every step after the
decision sends fewer bytes than the gradient. A script whose peer stops answering has its failed
sync counted and described (phase, step, the silent node) in faults.json. On a 4-node netns sim
cluster whose links are shaped to 0.2 Gbit/s (tier 1g): `fatpipe up -- examples/ddp_script.py` runs
the link check, the script chooses from its netcheck.json, and `fatpipe top --once --json`, `fatpipe
report` and summary.json show its per-node metrics, its comm decision and its fault counts.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import faults
import pytest

from fatpipe.infra.trainspec import TrainSpec
from fatpipe.ops.rdzv.nodefiles import USER_SCRIPT_MODULE
from fatpipe.stacks.sim import net as simnet
from fatpipe.trainer import api

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_script.py"
COMPRESSING = ("bf16", "fp16", "powersgd")
DECIDE_AT = 4  # trainer.api.scriptrun: auto decides after the script's 4th step
# What a node's torchrun runs a script through (ops.rdzv.nodefiles): its error file, and an end
# without Python's finalization (trainer.exiting).
AS_FATPIPE_RUNS_IT = ("-m", USER_SCRIPT_MODULE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_auto_picks_compression_for_a_script_on_a_slow_link(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "netcheck.json").write_text(json.dumps({"busbw_gbps": 0.002, "latency_s": 1e-4}))
    args = TrainSpec(comm="auto", warmup_steps=2, node_metrics_every=4).trainer_args()
    env = faults.cli_env(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **{
        api.RUN_DIR_ENV: str(run), api.TRAIN_ARGS_ENV: shlex.join(args)})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
           *AS_FATPIPE_RUNS_IT, str(EXAMPLE),
           "--steps", "12", "--batch-size", "4", "--seq-len", "32"]
    done = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    decision = summary["comm_decision"]
    assert decision["comm"] in COMPRESSING and decision["link"]["source"] == "netcheck.json", decision
    assert f"comm=auto chose {decision['comm']}" in done.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 13))
    assert {r["comm"] for r in records[:DECIDE_AT]} == {"none"}
    assert {r["comm"] for r in records[DECIDE_AT:]} == {decision["comm"]}
    if decision["comm"] != "powersgd":  # PowerSGD sends plain gradients for its first steps
        assert all(r["wire_bytes"] < r["grad_bytes"] for r in records[DECIDE_AT:])
    assert summary["world_size"] == 2 and summary["failed_collectives"] == 0
    views = [json.loads(line) for line in (run / "nodes.jsonl").read_text().splitlines()]
    assert views and views[-1]["last_step"] == 12


HANGING = """
import datetime, os, time, torch, torch.distributed as dist
import fatpipe.trainer.api as fatpipe
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
torch.manual_seed(0)
model = fatpipe.wrap(torch.nn.Linear(64, 64))
for step in range(1, 6):
    if step == 3 and dist.get_rank() == 1:
        time.sleep(600)  # its link is gone: rank 0's gradient sync of step 3 times out
    loss = model(torch.randn(4, 64)).square().mean()
    loss.backward()
    fatpipe.step(loss, tokens=4)
"""


def test_a_failed_sync_in_a_script_is_counted_and_described(tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "hanging.py"
    script.write_text(HANGING)
    args = TrainSpec(comm="none").trainer_args()
    env = faults.cli_env(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", FATPIPE_NODE_NAME="n", **{
        api.RUN_DIR_ENV: str(run), api.TRAIN_ARGS_ENV: shlex.join(args)})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
           "--max-restarts", "0", *AS_FATPIPE_RUNS_IT, str(script)]
    done = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=300)
    assert done.returncode != 0, done.stdout[-4000:]
    counts = json.loads((run / "faults.json").read_text())
    assert counts["failed_collectives"] == 1 and counts["collectives_attempted"] >= 3, counts
    failure = counts["failures"][0]
    assert (failure["phase"], failure["step"], failure["silent_nodes"]) == ("training", 3, ["n"])
    assert "collective failed in training at step 3" in done.stdout
    assert not (run / "summary.json").exists()  # a failed run has no summary
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


RESTARTED = """
import os, time, torch, torch.distributed as dist
import fatpipe.trainer.api as fatpipe
fatpipe.init_process_group(timeout_s=20)
torch.manual_seed(0)
model = fatpipe.wrap(torch.nn.Linear(64, 64))
for step in range(1, 6):
    if step == 3 and dist.get_rank() == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        # Silent in the first attempt: rank 0's step-3 sync times out and rank 0 records it, then
        # exits, and torchrun restarts the group. (A rank 1 that exited instead would race
        # torchrun, which on a loaded machine could stop rank 0 before it recorded anything.)
        time.sleep(300)
    loss = model(torch.randn(4, 64)).square().mean()
    loss.backward()
    fatpipe.step(loss, tokens=4)
"""


def run_restartable(tmp_path, source: str) -> tuple[Path, str]:
    """`source` as a script on 2 local torchrun processes with one restart: its run folder and
    output, once it succeeded."""
    run = tmp_path / "run"
    script = tmp_path / "script.py"
    script.write_text(source)
    env = faults.cli_env(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **{
        api.RUN_DIR_ENV: str(run), api.TRAIN_ARGS_ENV: "--comm none"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
           "--max-restarts", "1", *AS_FATPIPE_RUNS_IT, str(script)]
    done = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    return run, done.stdout


def test_fault_counts_outlive_a_restart_of_the_script(tmp_path):
    run, _ = run_restartable(tmp_path, RESTARTED)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["failed_collectives"] == 1, summary
    assert summary["collectives_attempted"] >= 7  # 2 or 3 syncs in the first attempt, 5 after
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # The first attempt's two steps are kept; the script, started again, counts on from them.
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert summary["steps"] == 7 and summary["final_loss"] == records[-1]["loss"]


# The script keeps its own checkpoint every 2 steps; a restart resumes from it and says so.
RESUMED = """
import os, time, torch, torch.distributed as dist
import fatpipe.trainer.api as fatpipe
fatpipe.init_process_group(timeout_s=60)
torch.manual_seed(0)
model = fatpipe.wrap(torch.nn.Linear(16, 16), steps=6)
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
start = 1 if first else 3  # its checkpoint of step 2
for step in range(start, 7):
    loss = model(torch.randn(4, 16)).square().mean()
    loss.backward()
    fatpipe.step(loss, tokens=4, step=step)
    if first and step == 4:
        dist.barrier()  # rank 0 recorded step 4
        if dist.get_rank() == 1:
            os._exit(3)  # torchrun stops rank 0 and starts both again
        time.sleep(300)
"""


def test_a_script_that_resumes_its_own_checkpoint_keeps_the_record_it_rewinds(tmp_path):
    run, output = run_restartable(tmp_path, RESUMED)
    written = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in written] == [1, 2, 3, 4, 3, 4, 5, 6], output[-4000:]
    assert written[4]["rewound_from"] == 4 and "steps 3-4 recorded before stay" in output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["steps"] == 6
    assert summary["final_loss"] == written[-1]["loss"]


# -- the whole path on a netns sim cluster --------------------------------------------------

NAME, OCTET, NODES, LINK_GBPS, STEPS = "spapi", 167, 4, 0.2, 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from conftest import netns_available, skip_or_fail

    if not netns_available():
        skip_or_fail("needs root and `ip netns`")
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform on PATH")
    folder = tmp_path_factory.mktemp(NAME)
    (folder / "examples").mkdir()
    shutil.copy(EXAMPLE, folder / "examples" / EXAMPLE.name)
    (folder / "fatpipe.toml").write_text(
        f'[clusters.{NAME}]\nprovider = "sim"\nnodes = {NODES}\ntier = "1g"\nisolation = "netns"\n'
        f'link_gbps = {LINK_GBPS}\nprivate_cidr = "10.{OCTET}.0.0/24"\nrdzv_port = {_free_port()}\n'
        # The decision from netcheck's figures is what this test reads; a loaded machine's step
        # times could trigger a re-probe (test_script_redecide.py covers that path).
        '\n[train]\nredecide = false\n')
    try:
        yield folder
    finally:
        faults.fatpipe(folder, "down", NAME, timeout=180)
        simnet.sweep_cluster(NAME, folder / ".fatpipe" / NAME / "nodes")


def test_fatpipe_up_runs_the_example_with_the_trainers_view(cluster):
    # --no-gate: the shaped links are below the 1g tier on purpose.
    done = faults.fatpipe(cluster, "up", NAME, "--netcheck", "quick", "--no-gate", "--comm", "auto",
                          "--warmup-steps", "2", "--node-metrics-every", "5", "--max-restarts", "0",
                          "--", "examples/ddp_script.py", "--steps", str(STEPS), "--batch-size", "2",
                          "--seq-len", "32", timeout=780)
    assert done.returncode == 0, done.stdout[-6000:]
    runs = cluster / ".fatpipe" / NAME / "runs"
    run = runs / (runs / "latest").read_text().strip()

    summary = json.loads((run / "summary.json").read_text())
    decision = summary["comm_decision"]
    assert decision["link"]["source"] == "netcheck.json" and decision["world_size"] == NODES
    assert decision["link"]["busbw_gbps"] < LINK_GBPS * 1.5  # the shaped link, not the tier
    assert decision["comm"] in COMPRESSING, decision  # a 1.9 MB gradient per tiny step
    assert summary["comm"] == decision["comm"] and summary["steps"] == STEPS
    assert summary["failed_collectives"] == 0 and summary["collectives_attempted"] >= STEPS
    assert "final loss" in done.stdout  # fatpipe up's summary table, from summary.json

    top = faults.fatpipe(cluster, "top", NAME, "--once", "--json", timeout=60)
    assert top.returncode == 0, top.stdout[-3000:]
    view = json.loads(top.stdout)
    assert view["finished"] and view["run"] == run.name
    assert [n["node"] for n in view["nodes"]] == [f"{NAME}-{i}" for i in range(NODES)]
    assert all(n["sync_s_p50"] > 0 and n["tx_gbps"] > 0 for n in view["nodes"])

    report = faults.fatpipe(cluster, "report", NAME, timeout=120)
    assert report.returncode == 0, report.stdout[-3000:]
    page = (run / "report.html").read_text()
    assert "comm decision" in page and "failed_collectives" in page and decision["comm"] in page
