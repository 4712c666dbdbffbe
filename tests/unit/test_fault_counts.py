"""Counted faults without processes: the agreed attempt number, the fault ledger across attempts
and torchruns, and what `fatpipe up` shows of them."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from fatpipe.cli.render import summary_table
from fatpipe.ops.run.summary import run_summary
from fatpipe.trainer import faults
from fatpipe.trainer.distenv import join_counter
from fatpipe.trainer.faults import FaultLedger, is_collective_failure

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def issued(monkeypatch):
    """A fresh count of issued collectives for the test."""
    counter = faults._Issued()
    monkeypatch.setattr(faults, "ISSUED", counter)
    return counter


def test_every_rank_agrees_on_the_attempt_whoever_counted_a_restart():
    # torchrun restarts every rank's worker on a new round; their agents' restart counts differ.
    store = dist.HashStore()
    assert [join_counter(store, r) for r in range(3)] == [1, 1, 1]
    assert [join_counter(store, r) for r in (2, 0, 1)] == [2, 2, 2]


def test_ledger_counts_across_attempts_and_torchruns(tmp_path, issued):
    store = dist.HashStore()
    first = FaultLedger(tmp_path, store, attempt=1, is_main=True)
    issued.add(10)
    first.push()
    issued.add(2)  # issued after the last push: a killed rank 0 would lose these
    # Rank 1 sees its collective fail and says so in the store; rank 0 was the one killed.
    FaultLedger(tmp_path, store, attempt=1, is_main=False).record_failure(
        RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"))

    issued.count = 0  # the next attempt is a new process
    second = FaultLedger(tmp_path, store, attempt=2, is_main=True)
    issued.add(5)
    assert second.totals() == {"collectives_attempted": 15, "failed_collectives": 1,
                               "sync_failure_rate": 1 / 15}
    second.save()

    # The run started again in the same folder, by a new torchrun (a new store): it adds on.
    issued.count = 0
    third = FaultLedger(tmp_path, dist.HashStore(), attempt=1, is_main=True)
    issued.add(4)
    assert third.totals()["collectives_attempted"] == 19
    assert third.totals()["failed_collectives"] == 1
    doc = json.loads((tmp_path / "faults.json").read_text())
    assert len(doc["runs"]) == 1 and doc["failed_collectives"] == 1


def test_rank_0_that_sees_the_failure_writes_it_at_once(tmp_path, issued):
    ledger = FaultLedger(tmp_path, dist.HashStore(), attempt=1, is_main=True)
    issued.add(3)
    ledger.record_failure(dist.DistNetworkError("timed out"))
    doc = json.loads((tmp_path / "faults.json").read_text())
    assert (doc["failed_collectives"], doc["collectives_attempted"]) == (1, 3)


def test_what_counts_as_a_failed_collective():
    assert is_collective_failure(dist.DistBackendError("x"))
    assert is_collective_failure(RuntimeError("Got the following error when running the callback: "
                                              "[../gloo/transport/tcp/pair.cc:553] Connection closed"))
    assert is_collective_failure(RuntimeError("Timed out waiting 60000ms for recv operation"))
    assert not is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_collective_failure(ValueError("gloo"))


def test_up_summary_shows_restarts_and_the_failure_rate(tmp_path):
    from rich.console import Console

    (tmp_path / "summary.json").write_text(json.dumps({
        "final_loss": 3.2, "steps": 40, "world_size": 3, "restarts": 1, "failed_collectives": 1,
        "collectives_attempted": 184, "sync_failure_rate": 1 / 184}))
    doc = run_summary(tmp_path, tier_gbps=1)
    assert (doc["restarts"], doc["failed_collectives"], doc["collectives_attempted"]) == (1, 1, 184)
    console = Console(width=160, record=True)
    console.print(summary_table(doc))
    text = console.export_text()
    assert "3 / 1" in text and "0.54% (1 of 184 collectives failed)" in text
    # A summary from before the counts shows a dash, not an error.
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 4}))
    console.print(summary_table(run_summary(tmp_path, tier_gbps=1)))
