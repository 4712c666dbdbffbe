"""The trainer under real torchrun: 2 CPU processes over gloo on 127.0.0.1, tiny preset."""

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

from fatpipe.trainer.checkpoint import (
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    rank_folder,
)
from fatpipe.trainer.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

JOIN_TIMEOUT_S = 120  # each torchrun must finish within this (~15-30 s normally), or fail
TINY = ["--preset", "tiny", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "3",
        "--timeout-s", "60"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(torch_only: Path | None = None) -> dict[str, str]:
    # One thread per rank (2 cores) and gloo pinned to loopback, whatever the host's name says.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    if torch_only:
        env["PYTHONPATH"] = str(_block_optional_modules(torch_only))
    return env


def _block_optional_modules(folder: Path) -> Path:
    """Stand-ins that fail to import, as on a node whose venv holds torch and nothing else."""
    for name in ("numpy", "psutil", "rich", "tensorboard"):
        (folder / "blocked" / name).mkdir(parents=True, exist_ok=True)
        (folder / "blocked" / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError('not installed on this node: {name}', name='{name}')\n")
    return folder / "blocked"


def torchrun(out: Path, *args: str, nproc: int = 2, max_restarts: int = 0,
             torch_only: Path | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--max-restarts", str(max_restarts),
           "--monitor-interval", "0.2",
           "-m", "fatpipe.trainer", *TINY, "--out", str(out), *args]
    return subprocess.Popen(cmd, env=_env(torch_only), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    return faults.finish_torchrun(proc, JOIN_TIMEOUT_S)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def final_params(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(list_checkpoints(out / "checkpoints")[-1][1])["model"]


# The uninterrupted run: checked on its own, and the reference for the killed-and-resumed run.
RESUMABLE = ["--steps", "30", "--checkpoint-every", "10", "--comm", "none", "--deterministic"]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    finish(torchrun(out, *RESUMABLE))
    return out


def test_loss_falls_and_replicas_agree(straight_run):
    out = straight_run
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 31))
    first, last = (sum(r["loss"] for r in rs) / 5 for rs in (records[:5], records[-5:]))
    assert last < first - 0.5, (first, last)
    s = summary(out)
    assert s["replicas_in_sync"] and len(set(s["param_digests"])) == 1
    assert len(s["param_digests"]) == s["world_size"] == 2
    assert s["steps"] == 30 and s["comm"] == "none" and s["restarts"] == 0
    assert set(records[0]) >= {"step", "loss", "lr", "step_s", "tokens_per_s", "sync_s",
                               "exposed_comm_s", "grad_bytes", "wire_bytes", "busbw_gbps",
                               "nic_tx_gbps", "nic_rx_gbps", "comm"}
    assert all(r["sync_s"] > 0 and r["wire_bytes"] == r["grad_bytes"] for r in records)
    assert sum(r["nic_tx_gbps"] for r in records) > 0  # loopback carried the gradients
    assert (out / "tb").is_dir()
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [20, 30]  # the last two


@pytest.mark.parametrize("comm", ["bf16", "fp16"])
def test_half_precision_hooks_run_and_send_half(tmp_path, comm):
    out = tmp_path / "run"
    # bf16 also runs on torch alone: no numpy, psutil, rich or tensorboard, as on a fresh node.
    finish(torchrun(out, "--steps", "6", "--comm", comm, "--bucket-cap-mb", "0.25",
                    torch_only=tmp_path if comm == "bf16" else None))
    records = read_metrics(out / "metrics.jsonl")
    assert all(r["comm"] == comm and r["wire_bytes"] * 2 == r["grad_bytes"] for r in records)
    s = summary(out)
    assert s["replicas_in_sync"] and s["wire_bytes_total"] < s["grad_bytes_total"]


def test_auto_reads_netcheck_and_picks_powersgd_for_a_slow_link(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    # A 10 Mbit/s link: only PowerSGD keeps the exposed communication small. 0.25 MB buckets:
    # several per step, which the PowerSGD-on-gloo guard must collapse into one.
    (out / "netcheck.json").write_text(json.dumps(
        {"busbw_gbps": 0.01, "latency_s": 1e-4, "world_size": 2}))
    # 12 steps: over 6, PowerSGD's 3 plain warmup steps make bf16 faster over the run.
    output = finish(torchrun(out, "--steps", "12", "--comm", "auto", "--bucket-cap-mb", "0.25"))
    assert "comm=auto chose powersgd" in output and "(netcheck.json)" in output
    assert "one DDP bucket" in output
    s = summary(out)
    assert s["comm"] == "powersgd" and s["replicas_in_sync"]
    assert s["comm_decision"]["link"]["busbw_gbps"] == 0.01
    # The periodic methods are weighed too; in 6 steps no interval leaves room for two syncs.
    assert set(s["comm_decision"]["predicted"]) == {"none", "bf16", "fp16", "powersgd",
                                                    "diloco", "localsgd"}
    assert not s["comm_decision"]["predicted"]["diloco"]["usable"]
    records = read_metrics(out / "metrics.jsonl")
    # Plain all-reduce until the LR warmup ends (3 steps), then low-rank factors only.
    assert records[0]["wire_bytes"] == records[0]["grad_bytes"]
    assert 0 < records[-1]["wire_bytes"] < records[-1]["grad_bytes"] / 5


def test_a_killed_worker_resumes_bitwise(tmp_path, straight_run):
    killed = tmp_path / "killed"
    proc = torchrun(killed, *RESUMABLE, max_restarts=1)
    victim, at_step = _kill_rank_after(proc, killed, rank=1, min_step=13)
    log = finish(proc)[-3000:]

    s = summary(killed)
    assert s["restarts"] == 1 and s["steps"] == 30, (at_step, s, log)
    steps = [r["step"] for r in read_metrics(killed / "metrics.jsonl")]
    assert steps == list(range(1, 31)), f"a step logged twice or lost (killed {victim} " \
                                        f"after step {at_step}): {steps}\n{log}"
    a, b = final_params(straight_run), final_params(killed)
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"resumed run diverged (killed after step {at_step}): {differ}\n{log}"


def test_powersgd_resumes_bitwise_from_each_ranks_own_checkpoint_part(tmp_path):
    """PowerSGD's error feedback differs per rank and lives in each rank's own part."""
    straight = tmp_path / "straight"
    flags = ["--steps", "12", "--checkpoint-every", "4", "--comm", "powersgd", "--deterministic"]
    finish(torchrun(straight, *flags))
    digests = summary(straight)["param_digests"]
    folder = straight / "checkpoints"
    assert [s for s, _ in list_checkpoints(folder)] == [8, 12]
    assert "rank_states" not in load_checkpoint(checkpoint_path(folder, 8))
    parts = [load_checkpoint(checkpoint_path(rank_folder(folder, r), 8)) for r in (0, 1)]
    errors = [torch.cat([e.flatten() for e in p["powersgd"]["error_dict"].values()])
              for p in parts]
    assert errors[0].abs().sum() > 0 and not torch.equal(*errors)  # compressed, and per rank

    def resume_from_8(name: str, drop_part: int | None = None) -> tuple[str, dict]:
        out = tmp_path / name
        shutil.copytree(straight, out)
        checkpoint_path(out / "checkpoints", 12).unlink()
        (out / "summary.json").unlink()
        if drop_part is not None:  # as on a node whose disk was replaced
            checkpoint_path(rank_folder(out / "checkpoints", drop_part), 8).unlink()
        return finish(torchrun(out, *flags)), summary(out)

    _, resumed = resume_from_8("resumed")
    assert resumed["param_digests"] == digests and resumed["steps"] == 12
    output, fresh = resume_from_8("part-lost", drop_part=1)
    assert "rank(s) [1] lack their own part" in output
    assert fresh["steps"] == 12 and fresh["replicas_in_sync"]


def _kill_rank_after(proc: subprocess.Popen, out: Path, rank: int,
                     min_step: int) -> tuple[int, int]:
    """SIGKILL one worker once a checkpoint exists and the run has moved past it.

    Returns the worker's pid and the last step rank 0 had logged."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if list_checkpoints(out / "checkpoints") and metrics.exists():
            lines = metrics.read_text().splitlines()
            if len(lines) >= min_step:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    try:
                        if child.environ().get("RANK") == str(rank):
                            child.send_signal(signal.SIGKILL)
                            return child.pid, len(lines)
                    except psutil.Error:
                        continue
        time.sleep(0.02)
    faults.kill_tree(proc)
    pytest.fail("the run ended or stalled before a worker could be killed")


def test_runs_alone_without_torchrun(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fatpipe.trainer", *TINY, "--steps", "3",
                           "--out", str(out)], env=_env(torch_only=tmp_path), capture_output=True,
                          text=True, timeout=JOIN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = summary(out)
    assert s["world_size"] == 1 and s["steps"] == 3 and s["comm"] == "none"
