"""comm=auto under live: replica groups in real processes (torchft's Manager, a Lighthouse, gloo over
loopback) take the same hook from their own, different measurements; a step with a healing group
is seen as such by every group, and the hook then sends plain float32."""

from __future__ import annotations

import lighthouses
import pytest
import torch
import torch.distributed as dist

from fatpipe.trainer.comm.hooks import TimedCommHook

pytest.importorskip("torchft")

pytestmark = pytest.mark.timeout(240)


def test_the_hook_sends_plain_float32_while_a_group_heals():
    sent = []

    def across(tensor):
        sent.append(tensor.dtype)
        done = torch.futures.Future()
        done.set_result(tensor)
        return done

    meter = TimedCommHook(torch.device("cpu"))
    meter.across, healing = across, [False]
    meter.use("bf16")
    meter.plain_while = lambda: healing[0]
    buffer = torch.ones(8)
    meter._run_across(None, buffer)
    healing[0] = True
    fut, wire = meter._run_across(None, buffer)
    assert sent == [torch.bfloat16, torch.float32] and wire == 32
    assert fut.wait().dtype == torch.float32


class _QuorumInFlight:
    """A Manager whose quorum is still configuring its process group when the hook asks, as on
    a step right after a node was lost; `fails`: the configuration then fails (torchft leaves
    the Manager errored and its process group unset)."""

    def __init__(self, fails: bool):
        self.fails, self.waited = fails, False
        self._pg = self

    def num_participants(self) -> int:
        self.waited = True
        return 2

    def errored(self):
        return RuntimeError("pg configure failed") if self.fails else None

    def size(self) -> int:
        assert self.waited and not self.fails, "process group not initialized"
        return 3  # a group heals: three in the quorum, two participate


@pytest.mark.parametrize("fails", [False, True])
def test_a_step_asks_about_healing_only_after_its_quorum(fails):
    from fatpipe.trainer.comm import autolive

    assert autolive.healing_in_quorum(_QuorumInFlight(fails)) is True


def _replica(rank: int, behind: bool, slow: float | None, lighthouse_port: int, out) -> None:
    """One group: its quorum, whether it sees a group healing, and (`slow`: its measured compute
    seconds) the hook comm=auto takes."""
    from fatpipe.trainer.comm import autolive
    from fatpipe.trainer.config import TrainConfig
    from fatpipe.trainer.distenv import DistEnv
    from fatpipe.trainer.model import seeded_gpt

    manager, store = lighthouses.replica_manager("auto", rank, lighthouse_port, {"w": torch.zeros(3)})
    dist.init_process_group("gloo", store=dist.PrefixStore("node", store), rank=0, world_size=1)
    if not behind:
        manager.load_state_dict({"step": 5, "batches_committed": 10})
    manager.start_quorum()
    manager.wait_quorum()
    healing = autolive.healing_in_quorum(manager)
    comm = None
    if slow is not None:
        cfg = TrainConfig(preset="tiny", batch_size=2, seq_len=32, steps=10)
        model = seeded_gpt("tiny", 32, 256, 1, torch.device("cpu"))
        env = DistEnv(0, 0, 1, 0, torch.device("cpu"), "gloo")
        # Each group measures a different compute time: the mean decides for all.
        autolive.measure_compute = lambda *_: slow
        comm = autolive.decide_live_comm(cfg, env, model, manager).comm
    out.put((rank, healing, manager.num_participants(), comm))
    lighthouses.end_replica(manager, out)


def test_every_group_sees_the_one_that_heals(tmp_path):
    results = lighthouses.run_replicas(tmp_path / "lh.log", _replica,
                                       [(r, r == 2, None) for r in range(3)], 200)
    assert [(healing, participants) for _, healing, participants, _ in results] == [(True, 2)] * 3


def test_groups_that_measured_apart_take_the_same_hook(tmp_path):
    results = lighthouses.run_replicas(tmp_path / "lh.log", _replica,
                                       [(0, False, 0.001), (1, False, 10.0)], 200)
    assert [healing for _, healing, _, _ in results] == [False, False]
    comms = {comm for *_, comm in results}
    assert len(comms) == 1 and comms <= {"none", "bf16"}, results
