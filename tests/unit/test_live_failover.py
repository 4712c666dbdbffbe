"""Failover by design: node 0's Lighthouse and replica group are killed mid-run, node 1's Lighthouse
forms the next quorum (numbering its own from 1, as node 0's did) and the Managers reach it
through their relays. Real processes: three replica groups' Managers, two Lighthouses, a relay per
node, gloo over loopback. At most the step in flight is lost, and the first attempt on the new
quorum commits: the Managers take it as a new epoch and form a new group without node 0 (acting on
the Lighthouse's id, they held quorum 1 already and took that attempt on the old group)."""

from __future__ import annotations

import multiprocessing as mp
import time

import lighthouses
import pytest
import torch

pytest.importorskip("torchft")

pytestmark = pytest.mark.timeout(240)

COMMITS = 3  # steps every group commits before the loss, and the survivors after it


def _replica(rank: int, relay_port: int, committed, out) -> None:
    from fatpipe.trainer.live.step import across_replicas, join_quorum

    manager, _store = lighthouses.replica_manager("failover", rank, relay_port,
                                                  {"w": torch.zeros(3)})
    across, attempts = across_replicas(manager), []
    deadline = time.monotonic() + 150
    while sum(ok for ok, groups in attempts if groups == 2) < COMMITS:
        assert time.monotonic() < deadline, attempts
        join_quorum(manager)
        across(torch.ones(4))
        groups = manager.num_participants()
        attempts.append((manager.should_commit(), groups))
        committed[rank] = manager.current_step()
        time.sleep(0.1)  # a step's pace, not a busy loop beside the suite
    out.put((rank, attempts))
    lighthouses.end_replica(manager, out)


def test_node_0s_loss_costs_at_most_the_step_in_flight(tmp_path):
    ports = [lighthouses.free_port() for _ in range(2)]  # node 0's and node 1's Lighthouses
    relays = [lighthouses.free_port() for _ in range(3)]
    # Node 0's asks for all three, so its first quorum (id 1) has every group.
    node0 = lighthouses.start_node_lighthouse(tmp_path / "lh0.log", relays[0], ports, ports[0], 3)
    lighthouses.start_node_lighthouse(tmp_path / "lh1.log", relays[1], ports, ports[1], 2)
    lighthouses.start_node_lighthouse(tmp_path / "lh2.log", relays[2], ports)
    ctx = mp.get_context("spawn")
    committed, out = ctx.Array("i", 3), ctx.Queue()
    procs = [ctx.Process(target=_replica, args=(r, relays[r], committed, out)) for r in range(3)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 150
        while min(committed[:]) < COMMITS:
            assert time.monotonic() < deadline and all(p.is_alive() for p in procs), committed[:]
            time.sleep(0.1)
        procs[0].kill()  # node 0 lost, its Lighthouse with it
        node0.kill()
        results = dict(out.get(timeout=150) for _ in range(2))
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        lighthouses.stop_all()
    for rank, attempts in results.items():
        assert sum(not ok for ok, _groups in attempts) <= 1, (rank, attempts)
        first_on_new_quorum = next(ok for ok, groups in attempts if groups == 2)
        assert first_on_new_quorum, (rank, attempts)
