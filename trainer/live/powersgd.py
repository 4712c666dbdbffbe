"""PowerSGD under `fault_tolerance = "live"`: torch's powerSGD_hook, its P and Q all-reduces sent
through torchft's Manager across the replica groups in the quorum (docs/ARCHITECTURE.md, "Live
fault tolerance").

What torchft 0.2.0's `Manager.allreduce` does that this relies on: it divides by the participants
only for ReduceOp.AVG (its default); PowerSGD asks for SUM and divides by the group's `size()`
itself, which here is `num_participants()`, so nothing is divided twice. A replica that is healing
(being sent the live state) has its tensor zeroed before the sum and is not counted in
`num_participants()`. PowerSGD's output is P P^T M (M: the participants' mean, P: the
orthonormalised sum of each one's M_i Q), so every replica ends a step with the same gradient and
the same P and Q memories whatever Q it started from (a healing replica's Q is zeroed with its
P). A Q that differs between participants would not split the weights, only pick a worse subspace.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from .epochs import link_rate
from .timeouts import allreduce_timed


class _Done:
    """A finished collective, as `dist.all_reduce(..., async_op=True)` returns one."""

    def __init__(self, tensors: list[torch.Tensor]):
        self._fut = torch.futures.Future()
        self._fut.set_result(tensors)

    def wait(self, timeout=None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut


class ManagerGroup:
    """What PowerSGD takes for its process group: `dist.all_reduce` on it is the Manager's
    all-reduce across the replica groups, waited for as `live.step.across_replicas` does (so
    PowerSGD's callbacks run in the hook, bucket after bucket, in one order on every replica).
    On an error the Manager has recorded it, the tensors may be garbage and the step will not
    commit."""

    def __init__(self, manager):
        self.manager, self.link = manager, link_rate(manager)

    def size(self) -> int:
        return self.manager.num_participants()

    def allreduce(self, tensors: list[torch.Tensor], opts) -> _Done:
        (tensor,) = tensors
        allreduce_timed(self.manager, self.link, tensor, reduce_op=opts.reduceOp)
        return _Done(tensors)


def reset_warm_start(state: psgd.PowerSGDState, seed: int, quorum_id: int) -> None:
    """Drop the warm-start P and Q; the next step's Qs are drawn from a generator every replica
    of the quorum seeds alike."""
    state.p_memory_dict.clear()
    state.q_memory_dict.clear()
    state.rng.seed([seed % 2**32, quorum_id % 2**32])


class LivePowerSGD:
    """Keeps one rank's PowerSGD state in step with the quorum's.

    - Compressing or not is the same on every replica (their all-reduces must match in size):
      PowerSGD's iteration is the quorum's committed steps, not this process's count.
    - Warm start: at every new quorum each replica drops its P and Q and draws fresh ones alike
      (`reset_warm_start`). Chosen over sending P and Q to a returning replica: torchft applies
      what it sends at the step's commit, after the step has made new P and Q, and a replica that
      starts at the quorum's step from its own checkpoint is sent nothing; a fresh Q costs one
      step's approximation, at a membership change only.
    - A step that does not commit leaves the state as it was before it (`settle`): its gradient
      is dropped, so the error feedback it left would count it twice when the step is taken again.
      Where replica groups disagree on a commit, the one that did not is behind at the next
      quorum and heals: its P and Q are zeroed in the sums and it leaves with the others'.
      (torchft 0.2.0 forms a new quorum after a failed commit, so warm start restarts then.)
    - Error feedback stays per replica, but a healing replica's is dropped: its gradient was on
      the weights it replaced and was not in the mean.
    """

    def __init__(self, manager, state: psgd.PowerSGDState, seed: int):
        state.process_group = ManagerGroup(manager)
        self.manager, self.state, self.seed = manager, state, seed
        self._quorum: int | None = None
        self._saved: dict | None = None  # the state before this attempt's first bucket

    def begin(self) -> None:
        """Before each bucket; acts at the attempt's first (its quorum is formed by then)."""
        if self._saved is not None:
            return
        state, manager = self.state, self.manager
        # torchft 0.2.0 keeps the quorum's id private; every member of a quorum has the same.
        quorum = manager._quorum_id
        if quorum != self._quorum:
            self._quorum = quorum
            reset_warm_start(state, self.seed, quorum)
        state.iter = manager.current_step()
        self._saved = _snapshot(state)

    def settle(self, committed: bool, healed: bool) -> None:
        """After the step's `should_commit`: keep what committed, restore what did not."""
        saved, self._saved = self._saved, None
        if saved is None:  # no bucket went through PowerSGD
            return
        if not committed:
            _restore(self.state, saved)
        if healed:
            self.state.error_dict.clear()


_COUNTERS = ("iter", "total_numel_before_compression", "total_numel_after_compression",
             "next_stats_report")


def _snapshot(state: psgd.PowerSGDState) -> dict:
    # torch's hook writes P and Q in place (small: rank x (rows + cols)) but gives each bucket a
    # new error tensor, so the error dict's entries are kept by reference, not copied.
    return {"error_dict": dict(state.error_dict),
            "p_memory_dict": {k: v.clone() for k, v in state.p_memory_dict.items()},
            "q_memory_dict": {k: v.clone() for k, v in state.q_memory_dict.items()},
            "rng": state.rng.get_state(),
            **{name: getattr(state, name) for name in _COUNTERS}}


def _restore(state: psgd.PowerSGDState, saved: dict) -> None:
    for name, value in saved.items():
        if name == "rng":
            state.rng.set_state(value)
        else:
            setattr(state, name, value)
