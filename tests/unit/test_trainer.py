"""The trainer's parts without processes: config, data order, schedule, comm choice, checkpoints."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fatpipe.trainer.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from fatpipe.trainer.comm.costmodel import GradTraffic, choose_comm, powersgd_wire_elements
from fatpipe.trainer.comm.decision import LinkEstimate
from fatpipe.trainer.config import ConfigError, TrainConfig, build_parser, parse_config
from fatpipe.trainer.data import DataCursor, ShardedBatches, load_corpus, stdlib_corpus
from fatpipe.trainer.metrics import summarize
from fatpipe.trainer.model import GPT, preset_config
from fatpipe.trainer.nic import traffic_interface
from fatpipe.trainer.optim import lr_factor

pytestmark = pytest.mark.timeout(60)


def test_flags_mirror_the_train_table():
    dests = {a.dest for a in build_parser()._actions} - {"help"}
    assert dests == set(TrainConfig.__dataclass_fields__)
    cfg = parse_config(["--preset", "tiny", "--bucket-cap-mb", "1.5", "--compile"])
    assert (cfg.preset, cfg.bucket_cap_mb, cfg.compile, cfg.comm) == ("tiny", 1.5, True, "auto")
    assert parse_config(["--no-compile"]).compile is False


def test_bad_values_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="--data"):
        parse_config(["--data", str(tmp_path / "missing.txt")])
    with pytest.raises(ConfigError, match="--steps"):
        TrainConfig(steps=0)


def test_bad_input_exits_nonzero_with_one_line(tmp_path):
    for args in (["--data", str(tmp_path / "nope")], ["--comm", "zip"]):
        proc = subprocess.run([sys.executable, "-m", "fatpipe.trainer", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "error" in proc.stderr


@pytest.mark.parametrize("preset,lo,hi", [("tiny", 0.5e6, 1.5e6), ("small", 20e6, 30e6),
                                          ("124m", 120e6, 130e6)])
def test_preset_sizes(preset, lo, hi):
    with torch.device("meta"):
        model = GPT(preset_config(preset, 1024 if preset == "124m" else 256))
    assert lo < model.num_params() < hi
    assert model.lm_head.weight is model.wte.weight


def test_data_order_is_deterministic_sharded_and_resumable():
    tokens = torch.randint(0, 256, (10_000,), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    make = lambda rank, cursor=None: ShardedBatches(tokens, 16, 4, rank, 2, seed=7,  # noqa: E731
                                                    cursor=cursor)
    a, b = make(0), make(1)
    first_a = [a.next_batch()[0] for _ in range(3)]
    first_b = [b.next_batch()[0] for _ in range(3)]
    assert not any(torch.equal(x, y) for x, y in zip(first_a, first_b, strict=True))
    # A stream rebuilt from the cursor continues exactly where the first one was.
    resumed = make(0, DataCursor(**a.cursor.to_dict()))
    for _ in range(a.batches_per_epoch + 2):  # across an epoch boundary
        x, y = a.next_batch()
        x2, y2 = resumed.next_batch()
        assert torch.equal(x, x2) and torch.equal(y, y2)
    assert a.cursor.epoch == 1
    again = make(0)
    assert all(torch.equal(x, again.next_batch()[0]) for x in first_a)


def test_targets_are_inputs_shifted_by_one():
    tokens = torch.frombuffer(bytearray(b"abcdefghij" * 100), dtype=torch.uint8)
    x, y = ShardedBatches(tokens, 8, 2, 0, 1, 0).next_batch()
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_default_corpus_ships_with_python(tmp_path):
    corpus = stdlib_corpus(limit=1 << 20)
    assert len(corpus) >= 1 << 20 and b"def " in bytes(corpus[:100_000].tolist())
    (tmp_path / "a.txt").write_text("hello ")
    (tmp_path / "b.md").write_text("world")
    assert bytes(load_corpus(str(tmp_path)).tolist()) == b"hello world"
    assert bytes(load_corpus(str(tmp_path / "a.txt")).tolist()) == b"hello "


def test_lr_warms_up_then_decays_to_a_tenth():
    assert lr_factor(0, 10, 100) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100) == pytest.approx(1.0)
    assert lr_factor(55, 10, 100) == pytest.approx(0.55)
    assert lr_factor(100, 10, 100) == pytest.approx(0.1)


def _choose(busbw_gbps: float, compute_s: float = 0.1):
    grad = 100_000_000
    return choose_comm(LinkEstimate(busbw_gbps, 1e-4, "test"), compute_s, grad_accum=1,
                       traffic=GradTraffic(grad, buckets=4, powersgd_bytes=grad // 50), world_size=8)


def test_auto_comm_picks_the_least_lossy_hook_that_fits():
    assert _choose(1000).comm == "none"  # fast link: nothing to gain from compression
    assert _choose(10).comm == "bf16"
    assert _choose(1).comm == "powersgd"
    slow = _choose(0.01)
    assert slow.comm == "powersgd" and "no hook" in slow.reason
    assert {"wire_bytes", "comm_s", "exposed_s", "share"} <= set(slow.predicted["none"])
    assert "Gbit/s" in slow.describe()
    grad = 100_000_000
    no_numpy = choose_comm(LinkEstimate(0.01, 1e-4, "test"), 0.1, 1, GradTraffic(grad, 4, grad // 50), 8,
                           hooks=("none", "bf16", "fp16"))
    assert no_numpy.comm == "bf16" and "powersgd" not in no_numpy.predicted


def test_powersgd_wire_estimate_follows_torchs_rule():
    # 512x512 at rank 4 compresses to (512+512)*4; a vector is sent as is.
    assert powersgd_wire_elements([torch.Size([512, 512]), torch.Size([512])], 4) == 4096 + 512
    assert powersgd_wire_elements([torch.Size([4, 4])], 4) == 16  # too small to gain


def test_checkpoints_are_atomic_and_the_last_two_kept(tmp_path):
    (tmp_path / ".step-00000005.pt.tmp-999").write_bytes(b"torn by a kill")
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {"step": step, "w": torch.full((3,), float(step))})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [20, 30]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert load_checkpoint(list_checkpoints(tmp_path)[-1][1])["w"][0] == 30


def test_powersgd_state_survives_a_checkpoint(tmp_path):
    from fatpipe.trainer.comm.hooks import (
        load_powersgd_state,
        make_powersgd_state,
        powersgd_state_dict,
    )

    state = make_powersgd_state(rank=2, start_iter=3, seed=1)
    state.error_dict[0] = torch.randn(5)
    state.q_memory_dict[0] = torch.randn(4)
    state.iter = 9
    state.rng.randint(100)
    save_checkpoint(tmp_path, 1, {"psgd": powersgd_state_dict(state)})
    restored = make_powersgd_state(rank=2, start_iter=3, seed=1)
    load_powersgd_state(restored, load_checkpoint(list_checkpoints(tmp_path)[0][1])["psgd"],
                        torch.device("cpu"))
    assert restored.iter == 9 and torch.equal(restored.error_dict[0], state.error_dict[0])
    assert torch.equal(restored.q_memory_dict[0], state.q_memory_dict[0])
    assert restored.rng.randint(1 << 30) == state.rng.randint(1 << 30)


def test_summary_percentiles_and_totals():
    recs = [{"step": i, "loss": 5.0 - i, "step_s": 0.1 * i, "sync_s": 0.01, "tokens_per_s": 1,
             "exposed_comm_s": 0.0, "busbw_gbps": 1.0, "nic_tx_gbps": 2.0, "grad_bytes": 10,
             "wire_bytes": 5} for i in range(1, 5)]
    s = summarize(recs, tokens_per_step=100, comm="bf16")
    assert s["steps"] == 4 and s["final_loss"] == 1.0 and s["wire_bytes_total"] == 20
    assert s["step_s_p50"] == pytest.approx(0.25) and s["tokens_per_s"] == pytest.approx(400)


def test_traffic_interface():
    assert traffic_interface({"GLOO_SOCKET_IFNAME": "lo"}) == "lo"
    assert traffic_interface({"NCCL_SOCKET_IFNAME": "=lo"}) == "lo"
    assert traffic_interface({"NCCL_SOCKET_IFNAME": "l"}) == "lo"  # NCCL's prefix match
    assert traffic_interface({"NCCL_SOCKET_IFNAME": "^lo", "MASTER_ADDR": "127.0.0.1"}) == "lo"
    assert traffic_interface({"MASTER_ADDR": "127.0.0.1"}) == "lo"
    assert traffic_interface({}) == "lo"
