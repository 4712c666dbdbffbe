"""PowerSGD under live: its P and Q all-reduces go through torchft's Manager, and its state stays
the quorum's. Three replica groups in real processes (torchft's Manager, a Lighthouse, gloo over
loopback): one catching up at the first step, one whose second step does not commit. Each step's
gradient is PowerSGD of the contributing replicas' mean, the same on every replica, and every
replica, the one that caught up and the one that failed a step included, ends with the same P and
Q. The rest runs in this process on a stand-in Manager: a step that does not commit leaves the
state as it was, and a new quorum resets warm start alike everywhere.
"""

from __future__ import annotations

import lighthouses
import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from fatpipe.trainer.api.ddpcomm import use_comm
from fatpipe.trainer.comm.decision import CommDecision
from fatpipe.trainer.comm.hookcost import _Bucket
from fatpipe.trainer.comm.hooks import TimedCommHook, make_powersgd_state
from fatpipe.trainer.config import TrainConfig
from fatpipe.trainer.live.powersgd import ManagerGroup, reset_warm_start
from fatpipe.trainer.live.step import across_replicas

pytestmark = pytest.mark.timeout(180)

CFG = TrainConfig(powersgd_rank=2, warmup_steps=2, seed=7)  # compresses from step 3 (iter 2)
SHAPE = (16, 12)  # compressed at rank 2; the (12,) bias is sent as it is
WIRE = (16 * 2 + 12 * 2 + 12) * 4  # P, Q and the bias, float32
AHEAD = 5  # the committed steps of the replicas that are not behind


def _grads(rank: int, step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(*SHAPE, generator=gen), torch.randn(SHAPE[1], generator=gen)]


def _live_meter(manager) -> TimedCommHook:
    meter = TimedCommHook(torch.device("cpu"))
    meter.across, meter.node_size = across_replicas(manager), 1
    use_comm(meter, CFG, CommDecision("powersgd", "test"))
    return meter


def _sync(meter: TimedCommHook, grads: list[torch.Tensor]) -> torch.Tensor:
    meter.begin_step()
    bucket = _Bucket(grads)
    return meter.hook(None, bucket).wait()


def _replica(rank: int, lighthouse_port: int, out) -> None:
    weights = {"w": torch.full((3,), float(rank))}
    manager, _store = lighthouses.replica_manager("psgd", rank, lighthouse_port, weights)
    if rank != 2:  # replica 2 starts behind: it is sent the live state at the first step
        manager.load_state_dict({"step": AHEAD, "batches_committed": 2 * AHEAD})
    meter = _live_meter(manager)
    records = []
    for step in range(3):
        manager.start_quorum()
        manager.wait_quorum()
        grad = _sync(meter, _grads(rank, step))
        healed, participants = not manager.is_participating(), manager.num_participants()
        if rank == 1 and step == 1:
            manager.report_error(RuntimeError("this step must not commit here"))
        committed = manager.should_commit()
        meter.settle(committed, healed)
        state, comm = meter.state, meter.end_step()
        records.append({
            "out": grad.tolist(), "p": state.p_memory_dict[0].tolist(),
            "q": state.q_memory_dict[0].tolist(),
            "err": state.error_dict[0].tolist() if 0 in state.error_dict else None,
            "healed": healed, "participants": participants, "committed": committed,
            "quorum": manager._quorum_id, "wire": comm.wire_bytes})
    out.put((rank, records))
    lighthouses.end_replica(manager, out)


class _OneReplica:
    """A Manager with one replica in its quorum: its all-reduce leaves the tensor as it is."""

    def __init__(self, quorum_id: int = 1, step: int = AHEAD):
        self._quorum_id, self.step = quorum_id, step

    def current_step(self) -> int:
        return self.step

    def num_participants(self) -> int:
        return 1

    def allreduce(self, tensor, reduce_op):
        assert reduce_op == dist.ReduceOp.SUM  # PowerSGD divides by size() itself
        return self

    def errored(self):
        return None

    def wait(self) -> bool:
        return True


def _reference(inputs: list[list[torch.Tensor]], quorum_id: int | None = None,
               warm: tuple[list, list] | None = None, iteration: int = AHEAD) -> list[float]:
    """PowerSGD in one process on the exact mean of `inputs`: from the Q a reset at `quorum_id`
    draws, or from the warm-start (P, Q) given."""
    state = make_powersgd_state(CFG.powersgd_rank, CFG.warmup_steps, CFG.seed)
    state.process_group = ManagerGroup(_OneReplica())
    state.use_error_feedback = False  # the inputs carry each replica's error already
    if warm is None:
        reset_warm_start(state, CFG.seed, quorum_id)
    else:
        state.p_memory_dict, state.q_memory_dict = ({0: torch.tensor(m)} for m in warm)
    state.iter = iteration
    mean = [torch.stack(parts).mean(0) for parts in zip(*inputs, strict=True)]
    return psgd.powerSGD_hook(state, _Bucket(mean)).wait().tolist()


def _with_error(grads: list[torch.Tensor], err: list[float] | None) -> list[torch.Tensor]:
    if err is None:
        return grads
    flat = torch.cat([g.reshape(-1) for g in grads]) + torch.tensor(err)
    return [flat[:grads[0].numel()].view(SHAPE), flat[grads[0].numel():]]


def _close(a: list[float], b: list[float]) -> bool:
    return torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-5)


def test_powersgd_through_the_manager_is_the_contributors_low_rank_mean(tmp_path):
    pytest.importorskip("torchft")
    runs = dict(lighthouses.run_replicas(tmp_path / "lh.log", _replica, [(r,) for r in range(3)]))
    steps = [[runs[r][s] for r in range(3)] for s in range(3)]
    for s, recs in enumerate(steps):
        # Every replica ends each step with the same gradient, and every one that committed
        # with the same P and Q.
        assert recs[0]["out"] == recs[1]["out"] == recs[2]["out"], s
        kept = [(r["p"], r["q"]) for r in recs if r["committed"]]
        assert len(kept) >= 2 and all(k == kept[0] for k in kept), s
        assert all(r["wire"] == WIRE for r in recs), recs
    first, second, third = steps
    # Step 1: replica 2 catches up; the mean is over replicas 0 and 1 (its gradient not in it),
    # from the Q that the new quorum's reset draws; its error feedback is dropped.
    assert [(r["healed"], r["participants"], r["committed"]) for r in first] == [
        (False, 2, True), (False, 2, True), (True, 2, True)]
    assert _close(first[0]["out"], _reference([_grads(0, 0), _grads(1, 0)], first[0]["quorum"]))
    assert first[2]["err"] is None and first[0]["err"] is not None
    # Step 2: all three take part, in the same quorum (warm start kept: the reference starts
    # from step 1's P and Q); replica 1 does not commit and its state is step 1's again.
    assert [r["quorum"] for r in second] == [r["quorum"] for r in first]
    assert [r["committed"] for r in second] == [True, False, True]
    inputs = [_with_error(_grads(r, 1), first[r]["err"]) for r in range(3)]
    warm = (first[0]["p"], first[0]["q"])
    assert _close(second[0]["out"], _reference(inputs, warm=warm, iteration=AHEAD + 1))
    assert runs[1][1]["q"] == first[1]["q"] and runs[1][1]["err"] == first[1]["err"]
    # Step 3: replica 1 is behind and is sent the live state: it adds nothing to the mean, and
    # leaves with the others' P and Q (checked above for every step). torchft forms a new quorum
    # after a failed commit (then every replica resets warm start); in the same one, the
    # others' Q is what it started from.
    assert [(r["healed"], r["participants"]) for r in third] == [
        (False, 2), (True, 2), (False, 2)]
    inputs = [_with_error(_grads(r, 2), second[r]["err"]) for r in (0, 2)]
    quorum = third[0]["quorum"]
    warm = None if quorum != second[0]["quorum"] else (second[0]["p"], second[0]["q"])
    assert _close(third[0]["out"], _reference(inputs, quorum, warm, iteration=AHEAD + 2))
    assert third[1]["err"] is None


def test_a_step_that_does_not_commit_leaves_powersgd_as_it_was():
    manager = _OneReplica()
    meter = _live_meter(manager)
    assert isinstance(meter.state.process_group, ManagerGroup)
    _sync(meter, _grads(0, 0))
    meter.settle(True, False)
    state = meter.state
    before = ({k: v.clone() for k, v in state.error_dict.items()},
              {k: v.clone() for k, v in state.q_memory_dict.items()},
              state.total_numel_after_compression)
    _sync(meter, _grads(0, 1))
    assert not torch.equal(state.q_memory_dict[0], before[1][0])
    meter.settle(False, False)
    after = (state.error_dict, state.q_memory_dict, state.total_numel_after_compression)
    assert torch.equal(after[0][0], before[0][0]) and torch.equal(after[1][0], before[1][0])
    assert after[2] == before[2]
    meter.settle(True, True)  # a second settle without a step changes nothing
    assert 0 in state.error_dict
    _sync(meter, _grads(0, 2))
    meter.settle(True, True)  # healed: its gradient was not in the mean
    assert state.error_dict == {}


def test_the_quorums_committed_steps_say_when_powersgd_compresses():
    manager = _OneReplica(step=1)  # start_powerSGD_iter 2: step 2 is still plain
    meter = _live_meter(manager)
    _sync(meter, _grads(0, 0))
    meter.settle(True, False)
    assert meter.end_step().wire_bytes == (16 * 12 + 12) * 4
    manager.step = 2
    _sync(meter, _grads(0, 1))
    assert meter.end_step().wire_bytes == WIRE


def test_a_new_quorum_resets_warm_start_alike_on_every_replica():
    old, new = _OneReplica(quorum_id=1), _OneReplica(quorum_id=1)
    long_running, fresh = _live_meter(old), _live_meter(new)
    for step in range(3):  # its warm-start Q has moved on from the first one
        _sync(long_running, _grads(0, step))
        long_running.settle(True, False)
    long_running.state.error_dict.clear()  # the same input on both: only Q may differ

    def synced(meter):
        out = _sync(meter, _grads(1, 9))
        meter.settle(True, False)
        return out

    assert not torch.equal(synced(long_running), synced(fresh))  # one quorum: Qs differ
    long_running.state.error_dict.clear()
    fresh.state.error_dict.clear()
    old._quorum_id = new._quorum_id = 2
    assert torch.equal(synced(long_running), synced(fresh))
    assert torch.equal(long_running.state.q_memory_dict[0], fresh.state.q_memory_dict[0])
