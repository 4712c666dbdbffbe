"""The live step's mean is over the gradients contributed: three replica groups in real processes
(torchft's Manager, a Lighthouse, gloo over loopback), one of them behind and catching up. It adds
no zeros to the mean (1 and 2 average to 1.5, not 1.0), and it receives the same mean as the rest.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from datetime import timedelta

import lighthouses
import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchft")

pytestmark = pytest.mark.timeout(180)


def _replica(rank: int, lighthouse_port: int, behind: bool, out: mp.Queue) -> None:
    from fatpipe.trainer.live.manager import LiveSettings, live_manager
    from fatpipe.trainer.live.step import across_replicas

    store_port = lighthouses.free_port()
    store = dist.TCPStore("127.0.0.1", store_port, is_master=True,  # noqa: F841 (kept alive)
                          timeout=timedelta(seconds=30), wait_for_workers=False)
    state = {"w": torch.full((3,), float(rank))}
    settings = LiveSettings(lighthouse=f"127.0.0.1:{lighthouse_port}", private_ip="127.0.0.1",
                            replica_id=f"mean-{rank}", store_port=store_port, nodes=3,
                            node_rank=rank)
    manager = live_manager(settings, lambda: dict(state),
                           lambda sd: state.update(w=sd["w"].clone()), 0, 1)
    if not behind:
        manager.load_state_dict({"step": 5, "batches_committed": 10})
    manager.start_quorum()
    manager.wait_quorum()
    grad = torch.full((4,), float(rank + 1))
    across_replicas(manager)(grad).wait()
    out.put((rank, grad.tolist(), manager.is_participating(), manager.num_participants(),
             manager.should_commit(), state["w"].tolist(), manager.current_step()))
    manager.shutdown(wait=False)
    out.close()
    out.join_thread()  # the queue's feeder has sent the result
    os._exit(0)  # torchft's threads would hold the interpreter


def test_a_catching_up_replica_adds_no_zeros_to_the_mean(tmp_path):
    # All three in the first quorum, however late a loaded machine starts one of them.
    lighthouse, port = lighthouses.start_lighthouse(tmp_path / "lh.log", min_replicas=3)
    try:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_replica, args=(r, port, r == 2, out)) for r in range(3)]
        for p in procs:
            p.start()
        results = sorted(out.get(timeout=150) for _ in procs)
        for p in procs:
            p.join(30)
    finally:
        lighthouses.stop_all()
    for rank, grad, participating, participants, committed, _w, step in results:
        assert grad == [1.5] * 4, results  # (1 + 2) / 2: the third replica's zeros not counted
        assert participants == 2 and committed and step == 6, results
        assert participating == (rank != 2), results
    # The replica that was behind now holds the state of one that was not.
    assert results[2][5] in ([0.0] * 3, [1.0] * 3), results
