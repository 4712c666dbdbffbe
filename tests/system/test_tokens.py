"""Tokens, not bytes: the trainer under real torchrun (2 ranks, gloo on loopback) on nanoGPT's and
llm.c's shards, its one-line refusals of bad shards, and `fatpipe data prepare` feeding it."""

from __future__ import annotations

import array
import json
import math
import os
import pickle
import socket
import struct
import subprocess
import sys
from pathlib import Path

import faults
import pytest
import torch

from fatpipe.trainer.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOIN_TIMEOUT_S = 180
TINY = ["--preset", "tiny", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "2",
        "--timeout-s", "60", "--steps", "4", "--comm", "none", "--checkpoint-every", "0"]
ERROR = "python -m fatpipe.trainer: error: "


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path) -> dict[str, str]:
    """One thread per rank, gloo on loopback, and a node's venv: torch and nothing optional."""
    blocked = tmp_path / "blocked"
    for name in ("numpy", "psutil", "rich", "tensorboard", "tokenizers"):
        (blocked / name).mkdir(parents=True, exist_ok=True)
        (blocked / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError('not installed on this node: {name}', name='{name}')\n")
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONPATH": str(blocked)}


def torchrun(tmp_path: Path, out: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--max-restarts", "0",
           "--monitor-interval", "0.2", "-m", "fatpipe.trainer", *TINY, "--out", str(out), *args]
    return subprocess.Popen(cmd, env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def alone(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # The whole venv: without numpy, torch itself warns on stderr at import.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "fatpipe.trainer", *TINY, "--out",
                           str(tmp_path / "run"), *args], env=env,
                          capture_output=True, text=True, timeout=JOIN_TIMEOUT_S)


def pattern(n: int, vocab: int) -> list[int]:
    """A learnable stream: a fixed random sequence of 97 ids, repeated."""
    motif = torch.randint(0, vocab, (97,), generator=torch.Generator().manual_seed(5)).tolist()
    return (motif * (n // 97 + 1))[:n]


def raw_bin(path: Path, ids: list[int]) -> Path:
    path.write_bytes(array.array("H", ids).tobytes())
    return path


def llmc_bin(path: Path, ids: list[int], magic: int = 20240520) -> Path:
    code, version = ("I", 7) if magic == 20240801 else ("H", 1)
    header = struct.pack("<iii", magic, version, len(ids)).ljust(1024, b"\0")
    path.write_bytes(header + array.array(code, ids).tobytes())
    return path


def write_nanogpt(folder: Path) -> int:
    folder.mkdir()
    ids = pattern(40_000, 1000)
    raw_bin(folder / "train.bin", ids[:36_000])
    raw_bin(folder / "val.bin", ids[36_000:])
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 1000}))
    return 1000


def write_llmc(folder: Path) -> int:
    folder.mkdir()
    ids = pattern(40_000, 50257)  # GPT-2 tokens, no meta.pkl: llm.c's own shards
    llmc_bin(folder / "fw_val_000000.bin", ids[:4000])
    llmc_bin(folder / "fw_train_000001.bin", ids[4000:22_000])
    llmc_bin(folder / "fw_train_000002.bin", ids[22_000:])
    return 50257


@pytest.mark.parametrize("write, fmt", [(write_nanogpt, "nanoGPT"), (write_llmc, "llm.c")])
def test_two_ranks_train_on_token_shards(tmp_path, write, fmt):
    vocab = write(tmp_path / "data")
    out = tmp_path / "run"
    output = faults.finish_torchrun(torchrun(tmp_path, out, "--data", str(tmp_path / "data")),
                                    JOIN_TIMEOUT_S)
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 4 and s["world_size"] == 2 and s["replicas_in_sync"], output[-3000:]
    d = s["data"]
    assert (d["format"], d["vocab_size"], d["seq_len"]) == (fmt, vocab, 64)
    assert d["tokens"] == 36_000 and d["val"]["tokens"] == 4000
    # The model's vocabulary is the data's (padded to 64): the first loss is about ln(vocab),
    # far above the ln(256) = 5.5 of a byte model.
    first = read_metrics(out / "metrics.jsonl")[0]["loss"]
    assert abs(first - math.log(-(-vocab // 64) * 64)) < 0.5
    # tokens/s counts tokens: 2 ranks x 4 sequences x 64 tokens per step.
    assert s["tokens_per_s"] == pytest.approx(2 * 4 * 64 / s["step_s_p50"], rel=0.5)


def _bad_magic(d: Path) -> Path:
    llmc_bin(d / "fw_train_000000.bin", [1] * 5000)
    llmc_bin(d / "fw_train_000001.bin", [1] * 5000, magic=20240521)
    return d / "fw_train_000001.bin"


def _odd_bytes(d: Path) -> Path:
    (d / "train.bin").write_bytes(b"\1\0" * 5000 + b"\7")
    return d / "train.bin"


@pytest.mark.parametrize("make, says", [(_bad_magic, "bad magic 20240521"),
                                        (_odd_bytes, "odd byte count 10001")])
def test_a_bad_shard_is_one_line_and_exit_2(tmp_path, make, says):
    (tmp_path / "data").mkdir()
    bad = make(tmp_path / "data")
    proc = alone(tmp_path, "--data", str(tmp_path / "data"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"{ERROR}{bad}: {says}") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_an_id_past_the_vocabulary_stops_every_rank_with_one_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    ids = pattern(20_000, 1000)
    ids[12_345] = 1000  # one id past meta.pkl's vocabulary, in the share rank 0 scans
    raw_bin(data / "train.bin", ids)
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 1000}))
    proc = torchrun(tmp_path, tmp_path / "run", "--data", str(data))
    try:
        output, _ = proc.communicate(timeout=JOIN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        faults.kill_tree(proc)
        pytest.fail("a rank waited instead of failing: " + proc.communicate()[0][-3000:])
    line = (f"{ERROR}{data / 'train.bin'}: token id 1000 at token 12345 is past the vocabulary "
            f"of 1000 ids")
    assert proc.returncode != 0
    # Rank 1 holds none of the bad chunk: it stops with rank 0's line, not in a collective.
    assert output.count(line) == 2, output[-4000:]
    assert "DataError" not in output, output[-4000:]  # a line, not a worker's traceback
    assert not (tmp_path / "run" / "summary.json").exists()


def _train_bpe(tmp_path: Path, text_file: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train([str(text_file)], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "bpe.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize("tokenizer", ["bpe", "bytes"])
def test_data_prepare_makes_shards_the_trainer_reads(tmp_path, run_cli, tokenizer):
    text = tmp_path / "corpus"
    text.mkdir()
    for i in range(3):
        (text / f"doc{i}.txt").write_text("".join(
            f"line {j} of document {i}: the quick brown fox jumps over the lazy dog\n"
            for j in range(400)))
    spec = str(_train_bpe(tmp_path, text / "doc0.txt")) if tokenizer == "bpe" else "bytes"
    shards = tmp_path / "shards"
    result = run_cli("data", "prepare", str(text), "--tokenizer", spec, "--out", str(shards),
                     "--shard-tokens", "5000")
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in shards.glob("*.bin"))
    val = [n for n in names if "_val_" in n]
    assert val[0] == "corpus_val_000000.bin" and names[0] == f"corpus_train_{len(val):06d}.bin"
    assert len(names) - len(val) >= 3  # the train split spans several shards of 5000 tokens
    assert (shards / "meta.pkl").is_file()
    out = tmp_path / "run"
    faults.finish_torchrun(torchrun(tmp_path, out, "--data", str(shards)), JOIN_TIMEOUT_S)
    d = json.loads((out / "summary.json").read_text())["data"]
    vocab = 400 if tokenizer == "bpe" else 256
    assert (d["format"], d["vocab_size"]) == ("llm.c", vocab) and d["val"]["shards"] == len(val)
    # The validation share is the first 5% of the text, give or take a piece.
    assert 0.04 < d["val"]["tokens"] / (d["tokens"] + d["val"]["tokens"]) < 0.07
    if tokenizer == "bytes":  # one token per byte, every byte of the text kept
        total = sum(f.stat().st_size for f in text.iterdir())
        assert d["tokens"] + d["val"]["tokens"] == total
    else:  # BPE merges: fewer tokens than bytes
        assert d["tokens"] < sum(f.stat().st_size for f in text.iterdir()) / 2


def test_data_prepare_refuses_in_one_line(tmp_path, run_cli):
    (tmp_path / "a.txt").write_text("hello\n" * 1000)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    cases = [(["--tokenizer", "bytes", "--out", str(tmp_path / "taken")], "not an empty folder"),
             (["--tokenizer", str(tmp_path / "none.json"), "--out", str(tmp_path / "o")],
              "no such file"),
             (["--tokenizer", str(tmp_path / "a.txt"), "--out", str(tmp_path / "o")],
              "not a tokenizers JSON file")]
    for args, says in cases:
        result = run_cli("data", "prepare", str(tmp_path / "a.txt"), *args)
        assert result.exit_code == 2 and says in result.output, result.output
        assert result.output.strip().count("\n") == 0, result.output
    assert (tmp_path / "taken" / "x").read_text() == "mine" and not (tmp_path / "o").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "taken"]  # no temp folder left
