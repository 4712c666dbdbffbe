"""Resume under another data layout and ranks with different data, with real processes: the
trainer alone and under torchrun (gloo on 127.0.0.1), tiny preset, a small corpus of our own."""

from __future__ import annotations

import math
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import faults
import pytest

from fatpipe.trainer.checkpoint import list_checkpoints, load_checkpoint
from fatpipe.trainer.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOIN_TIMEOUT_S = 150
SEQ = 64
TINY = ["--preset", "tiny", "--batch-size", "4", "--seq-len", str(SEQ), "--warmup-steps", "2",
        "--timeout-s", "60", "--comm", "none"]
# 44 windows of 64 bytes: 2 held out, one gap, 41 trained on. Batch 4: 10 batches per epoch on
# one rank, 5 on each of two.
WINDOWS = 44


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **extra}


def _corpus(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    words = ["link", "node", "ring", "sync", "step", "loss", "rank", "data", "the", "a"]
    text = " ".join(rng.choice(words) for _ in range(2000)).encode()
    path.write_bytes(text[:WINDOWS * SEQ + 1])
    return path


def _alone(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.trainer", *TINY, "--out", str(out),
                           *args], env=_env(), capture_output=True, text=True,
                          timeout=JOIN_TIMEOUT_S)


def _torchrun(out: Path, *args: str, nproc: int = 2) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
           "--max-restarts", "0", "--monitor-interval", "0.2", "-m", "fatpipe.trainer", *TINY,
           "--out", str(out), *args]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    return faults.finish_torchrun(proc, JOIN_TIMEOUT_S)


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_resume_on_more_ranks_continues_at_the_remapped_position(tmp_path):
    """1 rank for 9 steps (cursor: batch 9 of 10), then 2 ranks (5 batches per epoch): restored
    as is, that cursor gave empty batches and a NaN loss on every rank from then on."""
    data = _corpus(tmp_path / "corpus.txt", seed=1)
    out = tmp_path / "run"
    first = _alone(out, "--data", str(data), "--steps", "9", "--checkpoint-every", "3")
    assert first.returncode == 0, first.stderr[-4000:]
    saved = load_checkpoint(list_checkpoints(out / "checkpoints")[-1][1])
    assert saved["data_cursor"] == {"epoch": 0, "index": 9}

    log = _torchrun(out, "--data", str(data), "--steps", "14", "--checkpoint-every", "3")
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 15))
    assert all(math.isfinite(r["loss"]) for r in records[9:]), [r["loss"] for r in records]
    # 36 windows read; 2 ranks x 4 per batch: batch 5, the end of the new epoch -> the next one.
    assert ("data cursor remapped (world_size 1 -> 2): 36 windows of epoch 0 consumed -> "
            "epoch 1 batch 0 of 5, 4 window(s) skipped") in log
    assert saved["data_layout"]["windows_consumed"] == 36
    assert saved["data_layout"]["windows"] == 41 and saved["data_layout"]["world_size"] == 1
    resumed = load_checkpoint(list_checkpoints(out / "checkpoints")[-1][1])
    # Steps 10-14 on 2 ranks: 5 batches from (1, 0) -> (2, 0).
    assert resumed["data_cursor"] == {"epoch": 2, "index": 0}
    assert resumed["data_layout"]["world_size"] == 2
    summary = (out / "summary.json").read_text()
    assert '"eval_loss"' in summary and '"eval_windows": 2' in summary


def test_a_resume_with_another_seq_len_is_refused_and_touches_nothing(tmp_path):
    data = _corpus(tmp_path / "corpus.txt", seed=2)
    out = tmp_path / "run"
    first = _alone(out, "--data", str(data), "--steps", "4", "--checkpoint-every", "2")
    assert first.returncode == 0, first.stderr[-4000:]
    before = _files(out)

    again = _alone(out, "--data", str(data), "--steps", "8", "--seq-len", "32")
    assert again.returncode == 2, again.stderr[-4000:]
    errors = [line for line in again.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "cannot resume step 4" in errors[0], again.stderr[-4000:]
    assert "seq_len 64 -> 32" in errors[0] and "Traceback" not in again.stderr
    assert _files(out) == before  # no checkpoint, metric or summary touched


def test_a_node_with_other_data_fails_the_run_naming_it(tmp_path):
    """Two torchrun agents ("nodes" alpha and beta, one rank each); beta's corpus differs."""
    port = _free_port()
    out = tmp_path / "run"
    procs = []
    for node, name in enumerate(("alpha", "beta")):
        data = _corpus(tmp_path / f"corpus-{name}.txt", seed=10 + node)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
               str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
               "--master-port", str(port), "--max-restarts", "0", "-m", "fatpipe.trainer",
               *TINY, "--out", str(out), "--data", str(data), "--steps", "3"]
        procs.append(subprocess.Popen(cmd, env=_env(FATPIPE_NODE_NAME=name),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    logs = []
    try:
        logs = [p.communicate(timeout=JOIN_TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                faults.kill_tree(p)
    both = "\n".join(logs)
    assert all(p.returncode != 0 for p in procs), both[-4000:]
    assert "the data differs across nodes: node beta (rank 1) has 2817 bytes" in both, both[-4000:]
    assert "node alpha (rank 0) has 2817 bytes" in both
    assert not (out / "metrics.jsonl").exists()  # not one step trained
