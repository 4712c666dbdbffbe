"""What recording a step costs (trainer/api/record.py, the built-in trainer's and `fatpipe.step`'s
path): the NIC counters are read at most once a second, rank 0's collective count reaches the
store at most once a second (a failure sends it at once), and each step is one TensorBoard event."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from fatpipe.trainer import faults, nic
from fatpipe.trainer.api.record import RunRecord
from fatpipe.trainer.comm.hooks import StepComm
from fatpipe.trainer.config import TrainConfig
from fatpipe.trainer.distenv import DistEnv

pytestmark = pytest.mark.timeout(120)
STEPS = 100


class CountingStore:
    """A HashStore that counts the round trips a run makes to it."""

    def __init__(self):
        self.store, self.calls = dist.HashStore(), []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            return getattr(self.store, name)(*args)
        return call


@pytest.fixture
def counted(monkeypatch):
    """The collectives issued (fresh), the NIC counter reads, counted (1 MB sent per read), and
    the clock of both, which moves only when the test says."""
    issued = faults._Issued()
    monkeypatch.setattr(faults, "ISSUED", issued)
    reads: list[str] = []
    monkeypatch.setattr(nic, "interface_counters",
                        lambda name: (reads.append(name), (len(reads) * 10**6, 0))[1])
    clock = [1000.0]
    fake = SimpleNamespace(perf_counter=lambda: clock[0], monotonic=lambda: clock[0],
                           time=time.time, sleep=time.sleep)
    for module in (nic, faults):
        monkeypatch.setattr(module, "time", fake)
    return issued, reads, clock


def record(tmp_path, store) -> RunRecord:
    cfg = TrainConfig(preset="tiny", steps=STEPS, out=str(tmp_path), node_metrics_every=0)
    env = DistEnv(rank=0, local_rank=0, world_size=1, restarts=0, device=torch.device("cpu"),
                  backend="gloo")
    rec = RunRecord(cfg, env, store)
    rec.open()
    return rec


def test_a_hundred_quick_steps_read_the_nic_and_reach_the_store_once(tmp_path, counted):
    issued, reads, clock = counted
    store = CountingStore()
    run = record(tmp_path, store)
    store.calls.clear()
    for step in range(1, STEPS + 1):
        clock[0] += 0.005  # 5 ms steps: 100 of them in half a second
        issued.add()  # the step's gradient sync
        run.write(run.measure(step, 1.0, 1e-3, 0.01, 64, StepComm(), "none"))
    # The meter's first reading, then one for the first step's rates: the rest reuse them.
    assert len(reads) == 2
    assert store.calls.count("add") == 0
    clock[0] += 1.0
    issued.add()
    run.write(run.measure(STEPS + 1, 1.0, 1e-3, 0.01, 64, StepComm(), "none"))
    # A second later: one read, and the collectives so far sent in one round trip.
    assert len(reads) == 3 and store.calls.count("add") == 1
    assert store.store.add(run.faults._key("issued", 1), 0) == STEPS + 1
    run.close()
    # Every step is in metrics.jsonl; the first 100 with the rates of the first reading (1 MB in
    # 5 ms: 1.6 Gbit/s).
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, STEPS + 2))
    assert [r["nic_tx_gbps"] for r in lines[:STEPS]] == [pytest.approx(1.6)] * STEPS
    assert run.faults.totals()["collectives_attempted"] == STEPS + 1


def test_a_failure_sends_the_collective_count_at_once(tmp_path, counted):
    issued, _, _ = counted
    store = CountingStore()
    ledger = faults.FaultLedger(tmp_path, store, attempt=1, is_main=True, rank=0, world_size=1)
    ledger.push(now=False)
    issued.add(7)
    ledger.push(now=False)  # within the second: nothing sent
    assert store.store.add(ledger._key("issued", 1), 0) == 0
    ledger.record_failure(RuntimeError("[gloo] Connection closed by peer"))
    # The next attempt reads this attempt's count from the store.
    assert faults.FaultLedger(tmp_path, store, attempt=2, is_main=True, rank=0,
                              world_size=1).earlier["attempted"] == 7


def test_each_step_is_one_tensorboard_event_holding_every_number(tmp_path, counted):
    event_file = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    run = record(tmp_path, CountingStore())
    for step in range(1, 4):
        run.write(run.measure(step, 2.0 / step, 1e-3, 0.01, 64, StepComm(), "none"))
    run.close()
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    events = [e for e in event_file.LegacyEventFileLoader(str(path)).Load() if e.summary.value]
    assert [e.step for e in events] == [1, 2, 3]
    tags = {v.tag: v.simple_value for v in events[1].summary.value}
    assert tags["train/loss"] == 1.0 and "train/nic_tx_gbps" in tags and "train/step" not in tags
