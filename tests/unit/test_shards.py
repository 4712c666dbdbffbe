"""Token shards: nanoGPT's raw uint16 .bin and llm.c's headered shards, read as the trainer does."""

from __future__ import annotations

import array
import pickle
import struct
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from fatpipe.trainer.config import TrainConfig
from fatpipe.trainer.data import ShardedBatches, load_data, open_splits, split_windows
from fatpipe.trainer.datacheck import open_data
from fatpipe.trainer.distenv import DistEnv
from fatpipe.trainer.heldout import heldout_windows
from fatpipe.trainer.model import GPT, preset_config
from fatpipe.trainer.shards import DataError


def raw_bin(path: Path, ids: list[int]) -> Path:
    """nanoGPT's format: the uint16 tokens alone."""
    path.write_bytes(array.array("H", ids).tobytes())
    return path


def llmc_bin(path: Path, ids: list[int], magic: int = 20240520, version: int | None = None,
             count: int | None = None) -> Path:
    """llm.c's format: 256 int32 (magic, version, token count), then uint16 or uint32 tokens."""
    version = version if version is not None else {20240520: 1, 20240801: 7}.get(magic, 1)
    header = struct.pack("<iii", magic, version, len(ids) if count is None else count)
    code = "I" if magic == 20240801 else "H"
    path.write_bytes(header.ljust(1024, b"\0") + array.array(code, ids).tobytes())
    return path


def ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_nanogpt_bin_reads_uint16_ids_with_the_vocabulary_of_meta_pkl(tmp_path):
    tokens = [0, 1, 64, 40000, 65535 - 1] * 200  # above 32767: read as unsigned
    raw_bin(tmp_path / "train.bin", tokens)
    raw_bin(tmp_path / "val.bin", tokens[:100])
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65535, "stoi": {"a": 0}}))
    train, val = open_splits(str(tmp_path))
    assert (train.kind, train.vocab_size, len(train)) == ("nanoGPT", 65535, 1000)
    assert train.shards[0].read(0, 1000).tolist() == tokens
    assert len(val) == 100 and val.kind == "nanoGPT"
    # The file itself names the same split, with its val.bin beside it.
    train2, val2 = open_splits(str(tmp_path / "train.bin"))
    assert len(train2) == 1000 and len(val2) == 100


def test_gpt2_tokens_give_124m_context_1024_and_vocab_50304(tmp_path):
    raw_bin(tmp_path / "train.bin", ids(5000, 50257))
    cfg, (train, val) = load_data(TrainConfig(preset="124m", data=str(tmp_path)))
    assert train.gpt2_tokens and val is None and cfg.seq_len == 1024
    with torch.device("meta"):
        model = GPT(preset_config("124m", cfg.seq_len, train.vocab_size))
    assert (model.cfg.vocab_size, model.cfg.block_size) == (50304, 1024)
    assert 123e6 < model.num_params() < 125e6  # GPT-2 small: 124M with its 1024 positions
    # Other presets keep 256 unless told; bytes stay bytes.
    assert load_data(TrainConfig(preset="tiny", data=str(tmp_path)))[0].seq_len == 256
    (tmp_path / "t.txt").write_text("hello")
    cfg, (text, _) = load_data(TrainConfig(preset="124m", data=str(tmp_path / "t.txt")))
    assert (text.kind, text.vocab_size, cfg.seq_len) == ("bytes", 256, 256)
    assert preset_config("tiny", 64, 65).vocab_size == 128  # padded to a multiple of 64


def test_llmc_shards_uint16_and_uint32(tmp_path):
    a = ids(3000, 50257, 1)
    llmc_bin(tmp_path / "fw_val_000000.bin", a[:500])
    llmc_bin(tmp_path / "fw_train_000001.bin", a[500:2000])
    llmc_bin(tmp_path / "fw_train_000002.bin", a[2000:])
    train, val = open_splits(str(tmp_path))
    assert (train.kind, train.vocab_size, len(train), len(val)) == ("llm.c", 50257, 2500, 500)
    assert train.shards[1].read(0, 1000).tolist() == a[2000:]
    wide = tmp_path / "wide"
    wide.mkdir()
    big = [0, 70000, 128255, 5]
    llmc_bin(wide / "x_train_000000.bin", big * 10, magic=20240801)
    train, val = open_splits(str(wide))
    assert (train.vocab_size, val) == (128256, None)
    assert train.shards[0].read(0, 4).tolist() == big


def test_windows_stay_inside_a_shard_and_cover_every_shard(tmp_path):
    # Two shards whose tokens tell where they come from: a window never mixes them.
    llmc_bin(tmp_path / "d_train_000000.bin", [1] * 101)
    llmc_bin(tmp_path / "d_train_000001.bin", [2] * 201)
    train, _ = open_splits(str(tmp_path))
    batches = ShardedBatches(train, 10, 1, 0, 1, seed=3, holdout=False)
    assert batches.batches_per_epoch == 30  # 10 windows + 20 windows
    seen = [batches.next_batch() for _ in range(30)]
    rows = [torch.cat([x[0], y[0, -1:]]) for x, y in seen]
    assert all(len(set(r.tolist())) == 1 for r in rows)
    assert sorted(int(r[0]) for r in rows) == [1] * 10 + [2] * 20


@pytest.mark.parametrize("make, expected", [
    (lambda d: llmc_bin(d / "a_train_000000.bin", [1] * 10, magic=12345), "bad magic 12345"),
    (lambda d: (llmc_bin(d / "a_train_000000.bin", [1] * 10),
                raw_bin(d / "a_train_000001.bin", [1] * 10)), "bad magic 65537"),
    (lambda d: (d / "train.bin").write_bytes(b"\1\0\2"), "odd byte count 3"),
    (lambda d: llmc_bin(d / "a_train_000000.bin", [1] * 10, count=11), "header says 11 tokens"),
    (lambda d: llmc_bin(d / "a_train_000000.bin", [1] * 10, version=3), "version 3"),
    (lambda d: (raw_bin(d / "train.bin", [1] * 10),
                llmc_bin(d / "z.bin", [1] * 10)), "one format per dataset"),
    (lambda d: (raw_bin(d / "train.bin", [1] * 10),
                (d / "meta.pkl").write_bytes(b"cos\nsystem\n(S'true'\ntR.")), "os.system"),
])
def test_bad_shards_are_one_line_naming_the_file(tmp_path, make, expected):
    make(tmp_path)
    with pytest.raises(DataError) as e:
        open_splits(str(tmp_path))
    assert expected in str(e.value) and str(tmp_path) in str(e.value)
    assert "\n" not in str(e.value)


def test_ids_past_the_vocabulary_are_found_by_the_rank_whose_share_holds_them(tmp_path):
    tokens = ids(1000, 65)
    tokens[777] = 70
    raw_bin(tmp_path / "train.bin", tokens)
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65}))
    train, _ = open_splits(str(tmp_path))
    line = train.check_ids(0, 1)
    assert line == f"{tmp_path / 'train.bin'}: token id 70 at token 777 is past the vocabulary of 65 ids"
    assert train.check_ids(1, 2) is None  # one chunk: rank 0's share
    tokens[777] = 3
    raw_bin(tmp_path / "train.bin", tokens)
    assert open_splits(str(tmp_path))[0].check_ids(0, 1) is None


def test_text_is_still_read_as_bytes(tmp_path):
    (tmp_path / "a.txt").write_text("hello ")
    train, val = open_splits(str(tmp_path))
    assert (train.kind, train.vocab_size, val) == ("bytes", 256, None)
    assert bytes(train.shards[0].read(0, 6).tolist()) == b"hello "
    assert train.check_ids() is None


def test_a_validation_split_replaces_the_held_out_windows(tmp_path):
    # With val shards every training window is trained on and the eval reads val; without,
    # the last windows of the training data are held out (data.split_windows).
    llmc_bin(tmp_path / "d_train_000000.bin", [1] * 2001)
    llmc_bin(tmp_path / "d_val_000000.bin", [2] * 201)
    cfg, data = load_data(TrainConfig(preset="tiny", data=str(tmp_path), seq_len=10,
                                      batch_size=2))
    env = DistEnv(0, 0, 1, 0, torch.device("cpu"), "gloo")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        batches, layout = open_data(cfg, env, None, data)
        held_back, _ = open_data(cfg, env, None, (data[0], None))
    finally:
        dist.destroy_process_group()
    assert batches.train_windows == layout.windows == 200
    assert held_back.train_windows == split_windows(200)[0] == 189
    windows, held = heldout_windows(*data, seq_len=10)
    assert len(held) == 20 and set(windows.window(held[-1]).tolist()) == {2}
    windows, held = heldout_windows(data[0], None, seq_len=10)
    assert held == range(190, 200) and set(windows.window(held[0]).tolist()) == {1}
