"""The live step's mean is over the gradients contributed: three replica groups in real processes
(torchft's Manager, a Lighthouse, gloo over loopback), one of them behind and catching up. It adds
no zeros to the mean (1 and 2 average to 1.5, not 1.0), and it receives the same mean as the rest.
"""

from __future__ import annotations

import lighthouses
import pytest
import torch

pytest.importorskip("torchft")

pytestmark = pytest.mark.timeout(180)


def _replica(rank: int, behind: bool, lighthouse_port: int, out) -> None:
    from fatpipe.trainer.live.step import across_replicas

    state = {"w": torch.full((3,), float(rank))}
    manager, _store = lighthouses.replica_manager("mean", rank, lighthouse_port, state)
    if not behind:
        manager.load_state_dict({"step": 5, "batches_committed": 10})
    manager.start_quorum()
    manager.wait_quorum()
    grad = torch.full((4,), float(rank + 1))
    across_replicas(manager)(grad).wait()
    out.put((rank, grad.tolist(), manager.is_participating(), manager.num_participants(),
             manager.should_commit(), state["w"].tolist(), manager.current_step()))
    lighthouses.end_replica(manager, out)


def test_a_catching_up_replica_adds_no_zeros_to_the_mean(tmp_path):
    # All three in the first quorum, however late a loaded machine starts one of them.
    results = lighthouses.run_replicas(tmp_path / "lh.log", _replica,
                                       [(r, r == 2) for r in range(3)])
    for rank, grad, participating, participants, committed, _w, step in results:
        assert grad == [1.5] * 4, results  # (1 + 2) / 2: the third replica's zeros not counted
        assert participants == 2 and committed and step == 6, results
        assert participating == (rank != 2), results
    # The replica that was behind now holds the state of one that was not.
    assert results[2][5] in ([0.0] * 3, [1.0] * 3), results
