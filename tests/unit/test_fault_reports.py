"""Failures described without processes: where the trainer was when a collective failed, which
nodes never reported it, and the one line `fatpipe launch` prints for a failed run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from fatpipe.infra.defaults import FAULTS_FILE
from fatpipe.node.env import NODE_NAME
from fatpipe.ops.rdzv.noderun import LaunchResult
from fatpipe.ops.run.failure import describe_failure
from fatpipe.trainer import faults
from fatpipe.trainer.faults import FaultLedger, failure_point, short_error
from fatpipe.trainer.train import Trainer

pytestmark = pytest.mark.timeout(60)

GLOO_TIMEOUT = ("Got the following error when running the callback: RuntimeError: Got the following "
                "error when running the callback: RuntimeError: [/w/gloo/transport/tcp/"
                "unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation to complete")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(faults, "ISSUED", faults._Issued())
    monkeypatch.setattr(faults, "REPORT_WAIT_S", 0.5)


def failed_in_train_step(step: int) -> RuntimeError:
    """The error a collective raises inside the real Trainer.train_step, with its traceback."""
    def timed_out():
        raise RuntimeError(GLOO_TIMEOUT)

    trainer = SimpleNamespace(cfg=None, scheduler=SimpleNamespace(get_last_lr=timed_out))
    try:
        Trainer.train_step(trainer, step)
    except RuntimeError as e:
        return e
    raise AssertionError("train_step did not fail")


def ledger(tmp_path, store, monkeypatch, rank: int, attempt: int = 1) -> FaultLedger:
    monkeypatch.setenv(NODE_NAME, f"n-{rank}")
    return FaultLedger(tmp_path, store, attempt, is_main=rank == 0, rank=rank, world_size=3)


def test_the_launcher_and_the_trainer_name_the_same_file():
    assert FAULTS_FILE == faults.FAULTS_FILE


def test_the_phase_and_step_come_from_the_trainers_own_frames():
    assert failure_point(failed_in_train_step(9)) == ("training", 9)
    assert failure_point(RuntimeError("gloo: raised outside the trainer")) == ("startup", None)
    assert short_error(failed_in_train_step(9)) == "Timed out waiting 8000ms for recv operation to complete"


def test_rank_0_names_the_node_that_never_reported(tmp_path, monkeypatch):
    store = dist.HashStore()
    rank0, _, rank2 = (ledger(tmp_path, store, monkeypatch, r) for r in range(3))
    rank2.record_failure(failed_in_train_step(9))
    rank0.record_failure(failed_in_train_step(9))  # rank 1 (n-1) was cut off: no report
    (failure,) = json.loads((tmp_path / FAULTS_FILE).read_text())["failures"]
    assert (failure["attempt"], failure["phase"], failure["step"]) == (1, "training", 9)
    assert failure["silent_nodes"] == ["n-1"] and failure["error"].startswith("Timed out waiting")


def test_a_dead_rank_0s_failure_is_written_by_the_next_attempt(tmp_path, monkeypatch):
    store = dist.HashStore()
    for rank in range(3):
        ledger(tmp_path, store, monkeypatch, rank)
    for rank in (1, 2):  # rank 0 was killed: the others saw the collective fail
        ledger(tmp_path, store, monkeypatch, rank).record_failure(failed_in_train_step(11))
    ledger(tmp_path, store, monkeypatch, 0, attempt=2).save()
    (failure,) = json.loads((tmp_path / FAULTS_FILE).read_text())["failures"]
    assert failure["silent_nodes"] == ["n-0"] and (failure["phase"], failure["step"]) == ("training", 11)


class SlowStore:
    """A store that answers, but only after the reporting rank's link came back."""

    def __init__(self, store):
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    def set(self, key, value):
        time.sleep(faults.REPORT_WAIT_S + 0.2)
        return self.store.set(key, value)


def test_a_rank_that_reported_only_after_its_link_came_back_is_named(tmp_path, monkeypatch):
    store = dist.HashStore()
    rank0, rank1, rank2 = (ledger(tmp_path, store, monkeypatch, r) for r in range(3))
    rank1.store = SlowStore(store)
    for rank in (rank1, rank2, rank0):
        rank.record_failure(failed_in_train_step(9))
    (failure,) = json.loads((tmp_path / FAULTS_FILE).read_text())["failures"]
    assert failure["silent_nodes"] == ["n-1"], failure


def rendezvous(max_restarts: int) -> SimpleNamespace:
    nodes = [SimpleNamespace(name=f"n-{r}") for r in range(3)]
    return SimpleNamespace(max_restarts=max_restarts, join_timeout_s=180, nodes=nodes)


def result(run_dir: Path, **codes) -> LaunchResult:
    return LaunchResult("r", run_dir, exit_codes={k.replace("_", "-"): v for k, v in codes.items()})


def test_a_failed_run_is_one_line_naming_the_node_and_the_phase(tmp_path, monkeypatch):
    store, since = dist.HashStore(), time.time()
    rank0, _, rank2 = (ledger(tmp_path, store, monkeypatch, r) for r in range(3))
    rank2.record_failure(failed_in_train_step(9))
    rank0.record_failure(failed_in_train_step(9))
    failed = result(tmp_path, n_0=1, n_1=1, n_2=1)
    assert describe_failure(failed, rendezvous(0), since) == (
        "the run failed in training at step 9 (attempt 1 of 1, no restarts left): n-1 stopped "
        "answering (its link or its process went down); the error: Timed out waiting 8000ms for "
        "recv operation to complete")
    assert "(attempt 1 of 3)" in describe_failure(failed, rendezvous(2), since)
    # A failure from an earlier launch in the same folder is not this one's.
    assert "n-1 stopped" not in describe_failure(failed, rendezvous(0), time.time() + 1)
    assert describe_failure(result(tmp_path, n_0=0, n_1=0, n_2=0), rendezvous(0), since) is None


def test_without_the_trainers_word_the_logs_and_exit_codes_tell(tmp_path):
    (tmp_path / "node-0.log").write_text(
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: \n")
    assert describe_failure(result(tmp_path, n_0=1, n_1=0, n_2=0), rendezvous(0), 0) == (
        "the run failed at the rendezvous: torchrun on n-0 gave up waiting for all 3 nodes to join "
        "(join timeout 180 s)")
    (tmp_path / "node-0.log").write_text("ValueError: bad batch\n")
    failed = result(tmp_path, n_0=0, n_1=137, n_2=1)
    failed.stopped.append("n-2")  # stopped by fatpipe after n-1 failed: not the cause
    assert describe_failure(failed, rendezvous(0), 0) == "n-1 failed first: killed by SIGKILL"
    assert describe_failure(result(tmp_path, n_0=1, n_1=0, n_2=0), rendezvous(0), 0) == (
        "n-0 failed first: exit status 1 (ValueError: bad batch)")


def test_the_collective_timeout_override_is_not_launchs_own_timeout():
    # launch's --timeout (the whole run) and the [train] override --timeout-s share a name,
    # timeout_s: each must keep its own value.
    from fatpipe.cli.train_commands import launch

    ctx = launch.make_context("launch", ["c", "--timeout", "300", "--timeout-s", "8"])
    assert ctx.params["timeout_s"] == 300 and ctx.meta["train"] == {"timeout_s": 8.0}
