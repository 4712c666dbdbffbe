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
        comm = autolive.decide_live_comm(cfg, env, model, manager,
                                         autolive.measure_local(cfg, env, model)).comm
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


def _deciding(rank: int, role: dict, nodes: int, arrived, lighthouse_port: int, out) -> None:
    """One replica group through the first quorum and the attempts at steps 1 and 2 as the
    built-in trainer takes them (`livetrain`): comm=auto decides in each attempt at step 1, and
    each attempt all-reduces a gradient on the wire of the group's hook. `role`: its measured
    compute (with a slow link between the groups, so that its own numbers alone pick its own
    hook); `dies` (killed right after its probe, the others in the average); `hook` (the model's
    first pick, forced); `grace` (its gather deadline); `late` (it starts once the group with
    `arrives` passed its deadline)."""
    import os
    import signal

    from fatpipe.trainer.comm import autolive
    from fatpipe.trainer.comm.decision import CommDecision
    from fatpipe.trainer.config import TrainConfig
    from fatpipe.trainer.distenv import DistEnv
    from fatpipe.trainer.live.step import gather_quorum, join_quorum
    from fatpipe.trainer.model import seeded_gpt

    if role.get("late"):
        arrived.wait(120)
    manager, store = lighthouses.replica_manager("agree", rank, lighthouse_port, {"w": torch.zeros(3)})
    dist.init_process_group("gloo", store=dist.PrefixStore("node", store), rank=0, world_size=1)
    autolive.measure_compute = lambda *_: role["compute"]
    probe, decide = autolive.probe_replicas, autolive.decide_from

    def probed(*args):
        probe(*args)
        if role.get("dies"):
            os.kill(os.getpid(), signal.SIGKILL)
        return 0.01, 0.002  # Gbit/s, s: the link between the groups is what the hook pays for

    def forced(*args, **kwargs):
        autolive.decide_from = decide  # the first pick only
        return CommDecision(role["hook"], "forced")

    autolive.probe_replicas = probed
    if "hook" in role:
        autolive.decide_from = forced
    cfg = TrainConfig(preset="tiny", batch_size=2, seq_len=32, steps=10)
    model = seeded_gpt("tiny", 32, 256, 1, torch.device("cpu"))
    env = DistEnv(0, 0, 1, 0, torch.device("cpu"), "gloo")
    local = autolive.measure_local(cfg, env, model)
    gather_quorum(manager, nodes, role.get("grace", 60))
    if role.get("arrives"):
        arrived.set()
    attempts, decided, comm = 0, [], "none"
    while manager.current_step() < 2 and attempts < 10:
        if attempts:  # the first attempt is the gather's last quorum's
            join_quorum(manager)
        attempts += 1
        if manager.current_step() == 0:
            comm = autolive.decide_live_comm(cfg, env, model, manager, local).comm
            decided.append(comm)
        grad = torch.ones(1000, dtype=torch.bfloat16 if comm == "bf16" else torch.float32)
        manager.allreduce(grad).wait()
        manager.should_commit()
    out.put((rank, decided, comm, manager.current_step(), attempts))
    lighthouses.end_replica(manager, out)


def _run_deciding(log, roles: list[dict]) -> list:
    """Each role in a process of its own beside a Lighthouse that forms a quorum of two (a
    majority of three); what the groups that lived put on the queue, sorted."""
    import multiprocessing as mp

    _lh, port = lighthouses.start_lighthouse(log, min_replicas=2, join_ms=3000)
    ctx = mp.get_context("spawn")
    out, arrived = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_deciding, args=(r, role, len(roles), arrived, port, out))
             for r, role in enumerate(roles)]
    try:
        for p in procs:
            p.start()
        results = sorted(out.get(timeout=200) for role in roles if not role.get("dies"))
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        lighthouses.stop_all()
    return results


def _same_comm_and_committed(results, groups: int) -> None:
    assert len(results) == groups, results
    assert len({comm for _, _, comm, _, _ in results}) == 1, results
    assert all(step == 2 for _, _, _, step, _ in results), results


def test_groups_that_chose_apart_fail_step_one_and_decide_again(tmp_path):
    """The vote: groups whose model picked different hooks take none, step 1's first attempt
    fails on both (the Manager was told), and at the next quorum both decide again, agree and
    commit."""
    results = _run_deciding(tmp_path / "lh.log", [{"compute": 1.0, "hook": "bf16"},
                                                  {"compute": 1.0, "hook": "none"}])
    assert all(decided[0] == "none" and len(decided) == 2 for _, decided, *_ in results), results
    assert all(attempts == 3 for *_, attempts in results), results
    _same_comm_and_committed(results, 2)


def test_a_group_killed_in_the_probe_leaves_the_others_on_one_comm(tmp_path):
    """Group 2 is killed after its probe, the others waiting in the average: each holds its own
    numbers (which pick bf16 for one, none for the other); both take none, fail step 1, decide
    again without group 2, and commit."""
    results = _run_deciding(tmp_path / "lh.log", [{"compute": 1e-4}, {"compute": 100.0},
                                                  {"compute": 1.0, "dies": True}])
    assert all(decided[0] == "none" for _, decided, *_ in results), results
    _same_comm_and_committed(results, 2)


def test_a_group_that_arrives_at_the_deadline_leaves_every_group_on_one_comm(tmp_path):
    """Group 0's gather deadline passes with two groups while group 1 waits on; group 2 arrives
    just then. Every attempt at step 1 decides, so no group sends its gradient while another
    probes: every group ends on one comm, and steps commit."""
    results = _run_deciding(tmp_path / "lh.log", [{"compute": 1.0, "grace": 0.0, "arrives": True},
                                                  {"compute": 1e-4}, {"compute": 100.0, "late": True}])
    _same_comm_and_committed(results, 3)
