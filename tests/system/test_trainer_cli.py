"""`fatpipe train`: [train] from fatpipe.toml plus overrides, run through torchrun locally."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fatpipe.trainer.config import parse_config

PROJECT = """
[clusters.demo]
provider = "sim"
nodes = 2
tier = "1g"

[train]
preset = "tiny"
steps = 2
batch_size = 4
seq_len = 64
warmup_steps = 1
"""


class FakePopen:
    """Stands in for torchrun: records the command, exits with a chosen status."""

    calls: list[list[str]] = []
    code = 0

    def __init__(self, cmd):
        FakePopen.calls.append(cmd)

    def wait(self):
        return FakePopen.code


@pytest.fixture
def fake_torchrun(monkeypatch):
    FakePopen.calls, FakePopen.code = [], 0
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    return FakePopen


def test_builds_the_torchrun_command_from_the_file_and_flags(run_cli, project_dir, fake_torchrun):
    (project_dir / "fatpipe.toml").write_text(PROJECT)
    fake_torchrun.code = 3
    result = run_cli("train", "--nproc-per-node", "2", "--steps", "5", "--comm", "bf16")
    assert result.exit_code == 3  # torchrun's status, passed through
    cmd = fake_torchrun.calls[0]
    assert cmd[:4] == [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    # Every [train] key becomes a flag the trainer's own parser accepts.
    cfg = parse_config(cmd[cmd.index("fatpipe.trainer") + 1:])
    assert (cfg.preset, cfg.steps, cfg.comm, cfg.seq_len) == ("tiny", 5, "bf16", 64)
    assert cfg.out_dir.parent == project_dir / ".fatpipe" / "_local" / "runs"
    assert cfg.out_dir.is_dir()


def test_out_flag_and_missing_data(run_cli, project_dir, fake_torchrun):
    result = run_cli("train", "--run-dir", "elsewhere", "--preset", "tiny")
    assert result.exit_code == 0 and fake_torchrun.calls[0][-2:] == ["--out", "elsewhere"]
    result = run_cli("train", "--data", "no-such-corpus.txt")
    assert result.exit_code == 2 and "no-such-corpus.txt" in result.output
    assert len(fake_torchrun.calls) == 1  # refused before starting anything


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_trains_for_real_with_two_processes(project_dir):
    (project_dir / "fatpipe.toml").write_text(PROJECT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run([sys.executable, "-m", "fatpipe.cli", "train", "--nproc-per-node", "2",
                           "--comm", "none"], cwd=project_dir, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = list((project_dir / ".fatpipe" / "_local" / "runs").glob("*/summary.json"))
    assert len(runs) == 1
    summary = json.loads(runs[0].read_text())
    assert summary["steps"] == 2 and summary["world_size"] == 2 and summary["preset"] == "tiny"
    assert (runs[0].parent / "metrics.jsonl").exists()
    assert "results in" in proc.stderr
