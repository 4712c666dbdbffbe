"""Local SGD and DiLoCo under real torchrun (3 CPU processes over gloo on 127.0.0.1, tiny preset):
the loss falls, nothing is sent between syncs, the replicas agree after the last sync, and a
worker killed between syncs resumes bitwise; and a sim cluster's link_gbps reaches tc."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import faults
import psutil
import pytest
import torch
from conftest import netns_available, skip_or_fail

from fatpipe.trainer.checkpoint import (
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    rank_folder,
)
from fatpipe.trainer.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOIN_TIMEOUT_S = 150
STEPS, H, EVERY = 24, 5, 7  # checkpoints (7, 14, 21) fall between syncs (5, 10, 15, 20, 24)
FLAGS = ["--preset", "tiny", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "3",
         "--timeout-s", "60", "--steps", str(STEPS), "--sync-every", str(H),
         "--checkpoint-every", str(EVERY), "--deterministic"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out: Path, comm: str, max_restarts: int = 0) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "3",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
           "--max-restarts", str(max_restarts), "--monitor-interval", "0.2",
           "-m", "fatpipe.trainer", *FLAGS, "--comm", comm, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc: subprocess.Popen) -> str:
    return faults.finish_torchrun(proc, JOIN_TIMEOUT_S)


def kill_rank_between_syncs(proc: subprocess.Popen, out: Path, rank: int) -> int:
    """SIGKILL one worker once the first checkpoint (step 7, two steps past a sync) is written
    and the run has moved on; the step rank 0 had logged."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        done = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        if list_checkpoints(out / "checkpoints") and done >= EVERY + 1:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if child.environ().get("RANK") == str(rank):
                        child.send_signal(signal.SIGKILL)
                        return done
                except psutil.Error:
                    continue
        time.sleep(0.02)
    faults.kill_tree(proc)
    pytest.fail("the run ended or stalled before a worker could be killed")


def final_params(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(list_checkpoints(out / "checkpoints")[-1][1])["model"]


@pytest.fixture(scope="module", params=["diloco", "localsgd"])
def straight(request, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param) / "run"
    output = finish(torchrun(out, request.param))
    assert f"{request.param}: sync every {H} steps" in output
    return request.param, out


def test_loss_falls_syncs_are_periodic_and_replicas_agree(straight):
    comm, out = straight
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    first, last = (sum(r["loss"] for r in rs) / 4 for rs in (records[:4], records[-4:]))
    assert last < first - 0.4, (first, last)
    synced = [r["step"] for r in records if r["wire_bytes"]]
    assert synced == [5, 10, 15, 20, 24]  # every H steps, and the last step
    assert all(r["comm"] == comm and r["grad_bytes"] > 0 for r in records)
    assert all(r["sync_s"] == r["exposed_comm_s"] == 0 for r in records if not r["wire_bytes"])
    s = json.loads((out / "summary.json").read_text())
    assert s["replicas_in_sync"] and len(s["param_digests"]) == 3
    assert s["wire_bytes_total"] * H < s["grad_bytes_total"] * 1.5  # ~1/H of plain DDP's bytes
    step, path = list_checkpoints(out / "checkpoints")[-1]
    ckpt = load_checkpoint(path)
    # Each rank's own part is a file of its own, beside the shared part.
    parts = [load_checkpoint(checkpoint_path(rank_folder(out / "checkpoints", r), step))
             for r in range(3)]
    assert all("periodic" in part for part in parts)
    if comm == "diloco":  # after the last sync every replica is the outer step's result
        for rank in parts:
            assert all(torch.equal(a, p) for a, p in zip(
                ckpt["periodic"]["anchor"], rank["periodic"]["params"], strict=True))


def test_a_worker_killed_between_syncs_resumes_bitwise(straight, tmp_path):
    comm, reference = straight
    out = tmp_path / "killed"
    proc = torchrun(out, comm, max_restarts=1)
    at_step = kill_rank_between_syncs(proc, out, rank=2)
    log = finish(proc)[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["restarts"] == 1 and s["steps"] == STEPS and s["replicas_in_sync"], (at_step, log)
    a, b = final_params(reference), final_params(out)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{comm}: the resumed run diverged (killed after step {at_step}): " \
                       f"{differ}\n{log}"


NAME, OCTET = "sd-link", 249


def test_link_gbps_shapes_a_deployed_sim_cluster(needs_netns, tmp_path):
    if not netns_available() or not shutil.which("terraform"):
        skip_or_fail("needs root, `ip netns` and terraform")
    (tmp_path / "fatpipe.toml").write_text(
        f'[clusters.{NAME}]\nprovider = "sim"\nnodes = 2\ntier = "1g"\nisolation = "netns"\n'
        f'link_gbps = 0.025\nprivate_cidr = "10.{OCTET}.0.0/24"\nrdzv_port = {29500 + OCTET}\n')

    def fatpipe(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=tmp_path,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=240, env={**os.environ, "NO_COLOR": "1"})

    try:
        done = fatpipe("deploy", NAME, "--yes")
        assert done.returncode == 0, done.stdout[-4000:]
        outputs = json.loads((tmp_path / ".fatpipe" / NAME / "outputs.json").read_text())
        assert outputs["tier_gbps"] == 1  # the declared tier stays
        for node in outputs["nodes"]:
            qdisc = subprocess.run(["tc", "-n", node["netns"], "qdisc", "show", "dev", "eth0"],
                                   capture_output=True, text=True, timeout=10).stdout
            assert "rate 25Mbit" in qdisc, qdisc
    finally:
        fatpipe("down", NAME)
        from fatpipe.stacks.sim import net as simnet

        simnet.sweep_cluster(NAME, tmp_path / ".fatpipe" / NAME / "nodes")
