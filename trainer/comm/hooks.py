"""DDP communication: torch's comm hooks behind one wrapper that measures what they send.

The wrapper is the only hook DDP sees. It calls the chosen hook from
`torch.distributed.algorithms.ddp_comm_hooks` (none = plain all-reduce, bf16, fp16,
PowerSGD), counts the bytes that hook hands to all-reduce (`wire_bytes`) against the
uncompressed gradient (`grad_bytes`), and times every bucket from the moment its gradient is
ready to the moment its future completes. From those intervals a step gets `sync_s` (wall
time during which some bucket was being synchronised) and `exposed_s` (time from the last
bucket being ready, i.e. the end of backward compute, to the last future completing: the
communication nothing was left to hide).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from ..config import HOOK_NAMES
from ..faults import ISSUED
from ..lazy import load


def powersgd_available() -> bool:
    """torch's PowerSGDState draws its random seeds from numpy, which torch does not require."""
    try:
        load("numpy")
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class StepComm:
    """What the gradient synchronisation of one optimizer step cost."""

    sync_s: float = 0.0
    exposed_s: float = 0.0
    grad_bytes: int = 0
    wire_bytes: int = 0
    buckets: int = 0


class _Clock:
    """Timestamps that mean the same thing on CPU and GPU.

    On CUDA, host time says when work was queued, not when it ran, so marks are CUDA events
    recorded on the current stream (the hook's future callbacks run on streams that wait for
    the collective); they are read after the step has synchronised.
    """

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        # Name the device: future callbacks may run on a thread whose current device is 0.
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, origin, mark) -> float:
        return origin.elapsed_time(mark) / 1e3 if self.cuda else mark - origin


class TimedCommHook:
    """Runs a torch comm hook for DDP and records per step what it sent and how long it took."""

    def __init__(self, device: torch.device):
        self.clock = _Clock(device)
        self.name = "none"
        self.state: psgd.PowerSGDState | None = None
        # During the layout warm-up step the hook sends nothing and records nothing.
        self.passthrough = False
        self.ran_powersgd = False
        # fault_tolerance = "live" (trainer/live/step.py): the average over the node's ranks on
        # the default group, then `across(tensor)` averages it over the replica groups that are up.
        self.across = None
        self.node_size = 1
        # Across regions: the region's process group, which DDP and every hook sync over (None:
        # the world).
        self.group = None
        # Live PowerSGD: keeps its state agreed with the quorum's (`live.powersgd.LivePowerSGD`).
        self.keeper = None
        # Live comm=auto: true in a step where the hook sends plain float32 (`comm.autolive`).
        self.plain_while = None
        self.begin_step()

    def use(self, name: str, powersgd_state: psgd.PowerSGDState | None = None) -> None:
        if name not in HOOK_NAMES:
            raise ValueError(f"unknown comm hook {name!r}")
        if (name == "powersgd") != (powersgd_state is not None):
            raise ValueError("a PowerSGDState is required with, and only with, comm=powersgd")
        self.name, self.state, self.keeper = name, powersgd_state, None

    def settle(self, committed: bool, healed: bool) -> None:
        """Live: the step's commit (`healed`: this replica was sent the live state in it)."""
        if self.keeper is not None:
            self.keeper.settle(committed, healed)

    def begin_step(self) -> None:
        self._origin = self.clock.mark()
        self._spans: list[tuple[object, object]] = []  # (bucket ready, future done)
        self._grad_bytes = self._wire_bytes = 0

    def end_step(self) -> StepComm:
        """Collect the step's numbers; call after the step has synchronised with the device."""
        if not self._spans:
            return StepComm()
        spans = sorted((self.clock.seconds(self._origin, a), self.clock.seconds(self._origin, b))
                       for a, b in self._spans)
        busy, cover_end = 0.0, float("-inf")
        for start, end in spans:  # length of the union of the intervals
            busy += max(0.0, end - max(start, cover_end))
            cover_end = max(cover_end, end)
        exposed = max(0.0, max(e for _, e in spans) - max(s for s, _ in spans))
        return StepComm(busy, exposed, self._grad_bytes, self._wire_bytes, len(spans))

    def hook(self, state, bucket):
        """The hook registered with DDP: (state, dist.GradBucket) -> Future[Tensor].

        A bound method because DDP reads the hook's __name__; unannotated because DDP compares
        annotations with real types, and this module's annotations are strings.
        """
        if self.passthrough:
            # Every rank computes the same gradients of the same zero batch, so their average
            # is the local bucket: nothing to send (and the values are discarded anyway).
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        ISSUED.add()  # one gradient sync, whatever the hook puts on the wire
        ready = self.clock.mark()
        buffer = bucket.buffer()
        self._grad_bytes += buffer.numel() * buffer.element_size()
        fut, wire = self._run(bucket, buffer)
        self._wire_bytes += wire
        spans = self._spans

        def done(f: torch.futures.Future) -> torch.Tensor:
            spans.append((ready, self.clock.mark()))
            return f.value()

        return fut.then(done)

    def _run(self, bucket: dist.GradBucket, buffer: torch.Tensor):
        """Call the chosen hook; return its future and the bytes it passed to all-reduce."""
        full = buffer.numel() * buffer.element_size()
        if self.across is not None:
            return self._run_across(bucket, buffer)
        if self.name == "none":
            return default_hooks.allreduce_hook(self.group, bucket), full
        if self.name in ("bf16", "fp16"):
            # Called through this wrapper, DDP's name check that refuses the bf16 hook off NCCL
            # is not applied; gloo in this torch all-reduces bfloat16 correctly.
            hook = default_hooks.bf16_compress_hook if self.name == "bf16" else \
                default_hooks.fp16_compress_hook
            return hook(self.group, bucket), buffer.numel() * 2
        return self._powersgd(bucket, buffer)

    def _powersgd(self, bucket: dist.GradBucket, buffer: torch.Tensor):
        """PowerSGD on the state's process group; its future and the bytes it passed to it."""
        full = buffer.numel() * buffer.element_size()
        self.ran_powersgd = True
        state = self.state
        before = state.total_numel_after_compression
        compressing = state.iter >= state.start_powerSGD_iter
        fut = psgd.powerSGD_hook(state, bucket)
        # PowerSGD counts the elements it sends (P, Q and the tensors it leaves uncompressed);
        # before start_powerSGD_iter it sends the plain gradient.
        sent = (state.total_numel_after_compression - before) * buffer.element_size()
        return fut, sent if compressing else full

    def _run_across(self, bucket: dist.GradBucket, buffer: torch.Tensor):
        """Live: the node's ranks average over loopback, then the replica groups over the link
        (bf16/fp16 cast for the link, as torch's compress hooks do; PowerSGD compresses the
        node's mean, its P and Q summed through the Manager: `live.powersgd`)."""
        if self.name == "powersgd":
            self._node_mean(buffer)
            self.keeper.begin()
            return self._powersgd(bucket, buffer)
        plain = self.plain_while is not None and self.plain_while()
        if self.name in ("bf16", "fp16") and not plain:
            send = buffer.to(torch.bfloat16 if self.name == "bf16" else torch.float16)
        else:
            send = buffer
        self._node_mean(send)
        fut = self.across(send)
        if send is not buffer:
            fut = fut.then(lambda f: buffer.copy_(f.value()))
        return fut, send.numel() * send.element_size()

    def _node_mean(self, tensor: torch.Tensor) -> None:
        if self.node_size > 1:
            dist.all_reduce(tensor)
            tensor.div_(self.node_size)


def make_powersgd_state(rank: int, start_iter: int, seed: int) -> psgd.PowerSGDState:
    """PowerSGD with error feedback and warm start; plain all-reduce for `start_iter` steps."""
    return psgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=rank,
        # torch requires >= 2 with error feedback / warm start; compressing during LR warmup
        # costs accuracy (torch's own guidance), so start no earlier than the warmup ends.
        start_powerSGD_iter=max(2, start_iter),
        use_error_feedback=True,
        warm_start=True,
        random_seed=seed,
    )


# Internal PowerSGD state saved in checkpoints: error feedback, warm-start P/Q, iteration,
# compression counters and the numpy RNG that seeds fresh Qs.
_PSGD_TENSOR_DICTS = ("error_dict", "p_memory_dict", "q_memory_dict")
_PSGD_COUNTERS = ("iter", "total_numel_before_compression", "total_numel_after_compression",
                  "next_stats_report")


def powersgd_state_dict(state: psgd.PowerSGDState) -> dict:
    """A checkpointable copy of the state, made of tensors and ints only (weights_only-safe)."""
    kind, keys, pos, has_gauss, cached = state.rng.get_state()
    out = {name: {k: v.detach().cpu().clone() for k, v in getattr(state, name).items()}
           for name in _PSGD_TENSOR_DICTS}
    out.update({name: int(getattr(state, name)) for name in _PSGD_COUNTERS})
    out["rng"] = {"keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return out


def load_powersgd_state(state: psgd.PowerSGDState, saved: dict, device: torch.device) -> None:
    for name in _PSGD_TENSOR_DICTS:
        setattr(state, name, {int(k): v.to(device) for k, v in saved[name].items()})
    for name in _PSGD_COUNTERS:
        setattr(state, name, saved[name])
    r = saved["rng"]
    state.rng.set_state(("MT19937", r["keys"].numpy().astype("uint32"), r["pos"],
                         r["has_gauss"], r["cached_gaussian"]))
