"""The quorum id a replica group acts on (live.epochs) and a heal's timeouts (live.timeouts): a
quorum from another Lighthouse, or with other members, is a new epoch on every Manager alike,
even where the Lighthouse's own numbering repeats; a quorum in which a group is sent the live
state waits as long as the state takes over the link, never less than the floors."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from fatpipe.trainer.live import epochs
from fatpipe.trainer.live.epochs import EpochClient
from fatpipe.trainer.live.timeouts import (
    HealTimeouts,
    LinkRate,
    heal_copies,
    heal_timeout_s,
    state_bytes,
)

LH0, LH1 = "10.0.0.1:29502", "10.0.0.2:29505"
A, B, C = "n-0:uuid-a", "n-1:uuid-b", "n-2:uuid-c"


def quorum(quorum_id: int, members: list[str], step: int, at_step: int | None = None):
    """torchft's quorum result: `at_step` members are at the quorum's step, the rest behind."""
    current = len(members) if at_step is None else at_step
    return SimpleNamespace(quorum_id=quorum_id, replica_ids=sorted(members), max_step=step,
                           replica_world_size=len(members), max_world_size=current)


class FakeManager:
    """What HealTimeouts reads and sets on torchft's Manager."""

    def __init__(self, state_bytes: int = 4000):
        self.state = {"model": {"w": torch.zeros(state_bytes // 4)}, "step": 3}
        self._pg = SimpleNamespace(set_timeout=lambda t: setattr(self, "pg_timeout", t))
        self._checkpoint_transport = SimpleNamespace(
            _checkpoint_lock=SimpleNamespace(timeout=6.0),
            _server=SimpleNamespace(RequestHandlerClass=SimpleNamespace(timeout=6.0)))

    def _manager_state_dict(self):
        return {"user": {"default": self.state}, "torchft": {"step": 3}}


def client_seeing(rounds, monkeypatch, manager=None, tier=None) -> EpochClient:
    """An EpochClient whose Lighthouse hands `rounds[i][1]`, formed by `rounds[i][0]` (what its
    relay answers before and after it)."""
    answers = iter(r[1] for r in rounds)
    asked = []

    def serving(_address):
        asked.append(1)
        return rounds[(len(asked) - 1) // 2][0], 1

    class Torchft:
        def _quorum(self, **kwargs):
            return next(answers)

    monkeypatch.setattr(epochs, "serving_lighthouse", serving)
    timeouts = HealTimeouts(manager or FakeManager(), 6.0, 5.0, tier, ranks=1)
    return EpochClient(Torchft(), "127.0.0.1:29503", timeouts, init_sync=False)


def ids(rounds, monkeypatch) -> list[int]:
    client = client_seeing(rounds, monkeypatch)
    return [client._quorum(step=0).quorum_id for _ in rounds]


def failover() -> list[tuple]:
    """Node 0's Lighthouse formed quorum 1 of all three; node 1's forms its own quorum 1 of two."""
    return ([(LH0, quorum(1, [A, B, C], step)) for step in (5, 6, 7)]
            + [(LH1, quorum(1, [B, C], 7)), (LH1, quorum(1, [B, C], 8))])


def test_a_failover_to_a_lighthouse_that_numbers_from_one_is_a_new_epoch(monkeypatch):
    got = ids(failover(), monkeypatch)
    assert got[0] == got[1] == got[2], "the same quorum is one epoch, whatever its step"
    assert got[3] != got[2] and got[3] == got[4]
    assert ids(failover(), monkeypatch) == got  # every member derives the same ids


def test_the_same_quorum_id_and_members_from_another_lighthouse_is_a_new_epoch(monkeypatch):
    got = ids([(LH0, quorum(1, [A, B, C], 4)), (LH1, quorum(1, [A, B, C], 4))], monkeypatch)
    assert got[0] != got[1]


def test_a_lighthouse_started_again_never_hands_out_an_earlier_epoch(monkeypatch):
    # Its numbering starts from 1 again, with the members of its first quorum, later in the run.
    rounds = [(LH0, quorum(1, [A, B], 0)), (LH0, quorum(2, [A], 3)), (LH0, quorum(3, [A, B], 4)),
              (LH0, quorum(1, [A, B], 9))]
    got = ids(rounds, monkeypatch)
    assert len(set(got)) == 4, got


@pytest.mark.parametrize("before, after", [((LH0, 1), (LH1, 2)), ((LH0, 1), (LH0, 3)),
                                           (None, (LH1, 2)), ((LH0, 1), None)])
def test_a_quorum_whose_lighthouse_is_not_known_is_asked_for_again(monkeypatch, before, after):
    client = client_seeing([(LH0, quorum(1, [A, B], 0))], monkeypatch)
    answers = iter([before, after])
    monkeypatch.setattr(epochs, "serving_lighthouse", lambda _address: next(answers))
    with pytest.raises(TimeoutError, match="relay moved"):
        client._quorum(step=0)


def test_a_heal_waits_as_long_as_the_state_takes_over_the_link(monkeypatch):
    manager = FakeManager(state_bytes=250_000_000)  # 2 Gbit: 2 s at 1 Gbit/s
    rounds = [(LH0, quorum(1, [A, B], 5)), (LH0, quorum(2, [A, B, C], 5, at_step=2)),
              (LH0, quorum(2, [A, B, C], 6))]
    client = client_seeing(rounds, monkeypatch, manager, tier=1.0)
    client._quorum(step=5)
    assert manager._timeout == manager.pg_timeout == timedelta(seconds=6)  # the floors
    healing = client._quorum(step=5)
    heal = 6 + 3 * 2  # the floor, and three times the transfer
    assert manager._timeout == manager.pg_timeout == timedelta(seconds=heal)
    assert manager._quorum_timeout == timedelta(seconds=5 + 3 * 2)
    transport = manager._checkpoint_transport
    assert transport._checkpoint_lock.timeout == transport._server.RequestHandlerClass.timeout == heal
    # Healed: the same epoch (no new group), the floors again.
    assert client._quorum(step=6).quorum_id == healing.quorum_id
    assert manager._timeout == timedelta(seconds=6) and transport._checkpoint_lock.timeout == 6


def test_the_timeout_formula():
    assert heal_timeout_s(0, 1.0, 6.0) == 6.0
    gpt2 = 124_000_000 * 4 * 3  # GPT-2 124M with AdamW: about 12 s at 1 Gbit/s
    assert heal_timeout_s(gpt2, 1.0, 6.0) == 6 + 36
    assert heal_timeout_s(gpt2, 10.0, 6.0) == 6 + 4  # whole seconds, rounded up
    assert heal_timeout_s(gpt2, 1.0, 6.0) < heal_timeout_s(2 * gpt2, 1.0, 6.0)
    assert state_bytes({"m": torch.zeros(10), "o": [torch.zeros(2, dtype=torch.bfloat16), 3]}) == 44


@pytest.mark.parametrize("groups, current, step, init_sync, copies", [
    (3, 3, 9, False, 0),  # no group heals
    (3, 2, 9, False, 1),  # one returns, two can send
    (4, 1, 9, False, 3),  # three return to one: its link carries three copies
    (5, 2, 9, False, 2),
    (3, 3, 0, True, 2),  # a script's first quorum: every group is sent one group's state
    (3, 3, 4, True, 0),
])
def test_the_copies_a_heal_sends_over_the_busiest_link(groups, current, step, init_sync, copies):
    result = SimpleNamespace(replica_world_size=groups, max_world_size=current, max_step=step)
    assert heal_copies(result, init_sync) == copies


def test_the_link_is_the_lower_of_the_tier_and_the_measured_rate():
    timeouts = HealTimeouts(FakeManager(), 6.0, 5.0, tier_gbps=10.0, ranks=1)
    assert timeouts.link_gbps() == 10.0  # nothing measured yet
    timeouts.link.observe(1_000_000, 0.008)  # 1 Gbit/s
    assert timeouts.link_gbps() == pytest.approx(1.0)
    timeouts.link.paused = True  # in a heal the all-reduce waits for the transfer
    timeouts.link.observe(1_000_000, 10.0)
    assert timeouts.link_gbps() == pytest.approx(1.0)
    assert HealTimeouts(FakeManager(), 6.0, 5.0, None, 1).link_gbps() == 1.0  # the lowest tier
    link = LinkRate()
    for _ in range(20):
        link.observe(1_000_000, 0.8)  # links slowed: the last ones count
    link.observe(1_000_000, 0.0008)
    assert link.gbps() < 0.012


def test_each_all_reduce_takes_the_groups_timeout_of_the_moment():
    """Set between quorums, the timeout reaches the group already configured (a heal's quorum
    builds it with the heal's; the next one, the same group, is back to the floor)."""
    pytest.importorskip("torchft")
    from torch.distributed import AllreduceOptions

    from fatpipe.trainer.live.manager import _gloo_group

    group = _gloo_group(timedelta(seconds=47))
    assert group._opts_hook(AllreduceOptions()).timeout == timedelta(seconds=47)
    group.set_timeout(timedelta(seconds=6))
    assert group._opts_hook(AllreduceOptions()).timeout == timedelta(seconds=6)


def test_a_quorum_says_its_parts_once(monkeypatch):
    """The stall's split (bench/faults.py): the request's wait and the group's reconfigure, read once."""
    client = client_seeing([(LH0, quorum(1, [A, B], 5))], monkeypatch)
    slow = client.client._quorum
    client.client._quorum = lambda **kwargs: (time.sleep(0.05), slow(**kwargs))[1]
    client.group = SimpleNamespace(configure_s=0.25)
    client._quorum(step=0)
    timings = client.take_timings()
    assert timings["quorum_rpc_s"] >= 0.05 and timings["configure_s"] == 0.25
    assert client.take_timings() == {"quorum_rpc_s": 0.0, "configure_s": 0.0}
    assert epochs.quorum_timings(SimpleNamespace(_client=object())) == {}


def test_a_failed_exchange_lets_its_group_go_at_once():
    """What kept a failed gloo exchange's connections open (so a peer that is no neighbour of a
    dead group waited out its timeout): the group in torchft's wrapper and the failed work in
    the frames of the error torchft keeps. Both go; the error's text keeps its trace."""
    import weakref

    from torchft.manager import ExceptionWithTraceback

    from fatpipe.trainer.live.timeouts import drop_failed_group

    class Work:  # holds gloo's context, and so its connections, while it lives
        pass

    def exchange(work):
        raise RuntimeError("Connection closed by peer")

    work = Work()
    held = weakref.ref(work)
    try:
        exchange(work)
    except RuntimeError as e:
        error = ExceptionWithTraceback(e)  # as torchft's Manager keeps it (report_error)
    del work
    assert held() is not None  # the frame of `exchange` still holds it
    aborted = []
    manager = SimpleNamespace(errored=lambda: error, _pg=SimpleNamespace(abort=lambda: aborted.append(1)))
    drop_failed_group(manager)
    assert held() is None and aborted == [1]
    assert "Connection closed by peer" in str(error) and "exchange" in error.stack_trace
