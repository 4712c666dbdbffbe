"""comm = "auto": pick the least lossy comm hook whose predicted overhead fits.

Inputs are measured: the link's all-reduce bus bandwidth and latency (from the run's
netcheck.json, else a short probe now), the compute time of one step without any
communication, and each hook's own cost on this node (`hookcost`: the hook run against a
one-rank group, so no network). The model of a step is deliberately simple and logged with
its numbers, one dict per candidate:

    comm_s    = all-reduce rounds x latency + wire_bytes x 2(n-1)/n / (busbw x dtype rate)
    exposed_s = max(comm_s - overlap x backward_s, comm_s / buckets)
    step_s    = compute_s + hook_s + exposed_s

DDP can hide communication behind the backward pass of the last micro-batch (about two
thirds of forward + backward), except for the last bucket, which is ready only when backward
ends. The hook's own work (casts, PowerSGD's matrix products and orthogonalisation) is not
hidden: on a CPU it competes with backward for the same cores. A hook qualifies when
hook_s + exposed_s <= 20% of step_s. When none does, the fastest over the steps left wins
(`run_step_s`: PowerSGD sends plain gradients until its start step, at the plain step's cost).

The periodic methods (DiLoCo, local SGD) change the optimizer, not only the wire: they are
always priced and logged, but taken only when the caller allows it (`[train] auto_periodic`),
at an interval of MIN_AUTO_SYNC_EVERY steps or more. Otherwise the reason says which periodic
choice auto would have made and why it did not.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..bandwidth import bus_factor
from ..config import HOOK_NAMES
from .allreduce import measure_allreduce, timed_allreduce
from .decision import CommDecision, LinkEstimate
from .periodic import MIN_AUTO_SYNC_EVERY, predict_periodic

log = logging.getLogger(__name__)

EXPOSED_BUDGET = 0.20  # largest share of a step that communication may leave exposed
BACKWARD_SHARE = 2 / 3  # backward's share of forward + backward compute

_PROBE_LATENCY_BYTES = 4 << 10
_PROBE_START_BYTES = 256 << 10
_PROBE_BANDWIDTH_BYTES = 16 << 20
_PROBE_HALF_BYTES = 1 << 20
# An all-reduce this long measures the link's rate rather than its latency: the probe's message
# grows (x4) until one takes this long, so a fast link gets a large message and a slow one (the
# mid-run re-probe after a cut) is not made to carry megabytes several times over.
_PROBE_TARGET_S = 0.1


def read_netcheck(run_dir: Path) -> LinkEstimate | None:
    """The link as measured by `fatpipe netcheck`, if this run directory holds its result."""
    path = run_dir / "netcheck.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return LinkEstimate(float(data["busbw_gbps"]), float(data.get("latency_s", 0.0)),
                            "netcheck.json")
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring %s: %s", path, e)
        return None


def probe_link(device: torch.device, grad_bytes: int) -> LinkEstimate:
    """A short all-reduce probe: a small message for latency, a large one for bandwidth."""
    small = measure_allreduce(_PROBE_LATENCY_BYTES, iters=10, warmup=2, device=device)
    size = probe_size(device, grad_bytes)
    large = measure_allreduce(size, iters=3, warmup=1, device=device)
    return LinkEstimate(large.busbw_gbps, small.time_s, "probe", probe_half_rates(device, size))


def probe_size(device: torch.device, grad_bytes: int) -> int:
    """Collective: the bandwidth probe's message, from 256 KB up (x4) to the gradient size (at
    most 16 MB), stopping at the first whose all-reduce takes _PROBE_TARGET_S on the slowest
    rank. Every rank sees the same slowest time, so every rank takes the same sizes."""
    largest = max(_PROBE_LATENCY_BYTES, min(_PROBE_BANDWIDTH_BYTES, grad_bytes))
    size = min(_PROBE_START_BYTES, largest)
    while size < largest:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        if timed_allreduce(buf, 0, 1, device) >= _PROBE_TARGET_S:
            break
        size = min(4 * size, largest)
    return size


def probe_half_rates(device: torch.device, size: int) -> dict[str, float]:
    """Collective: how fast all-reduce moves bf16 and fp16 bytes against float32, same bytes
    (a quarter of the bandwidth probe's `size`, at most 1 MB: nine all-reduces of it)."""
    count = max(_PROBE_LATENCY_BYTES, min(_PROBE_HALF_BYTES, size // 4)) // 4
    base = timed_allreduce(torch.ones(count, device=device), 1, 2, device)
    rates = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        t = timed_allreduce(torch.ones(2 * count, dtype=dtype, device=device), 1, 2, device)
        # Fewer elements per byte cannot make the wire faster; above 1 is noise (a slow base).
        rates[name] = min(1.0, base / t) if t > 0 else 1.0
    return rates


def powersgd_wire_elements(shapes: list[torch.Size], rank: int, min_rate: float = 2.0) -> int:
    """Elements PowerSGD sends per step for these parameter shapes (torch's compress rule)."""
    total = 0
    for shape in shapes:
        n = shape[0] if len(shape) else 1
        m = math.prod(shape[1:]) if len(shape) > 1 else 1
        r = min(n, m, rank)
        compressed = (n + m) * r
        total += compressed if compressed * min_rate < n * m else n * m
    return total


@dataclass(frozen=True)
class GradTraffic:
    """What one step's gradient sync sends: its size, its DDP buckets, and PowerSGD's share."""

    grad_bytes: int
    buckets: int
    powersgd_bytes: int
    powersgd_buckets: int | None = None  # PowerSGD's own bucket count (one bucket on gloo)


@dataclass(frozen=True)
class HookCost:
    """What each hook costs beyond its bytes: its own seconds per step on this node (measured),
    and the steps it will send plain gradients before compressing, out of the steps left."""

    hook_s: dict = field(default_factory=dict)  # hook -> seconds per step; missing: 0
    plain_steps: dict = field(default_factory=dict)  # hook -> plain steps first; missing: 0
    steps_left: int = 0


def predict(compute_s: float, comm_s: float, hideable: float, n_buckets: int,
            hook_s: float) -> dict:
    """One candidate's step: compute, the hook's own work, and what communication leaves exposed."""
    exposed = max(comm_s - hideable, comm_s / n_buckets)
    step = compute_s + hook_s + exposed
    return {"compute_s": compute_s, "hook_s": hook_s, "comm_s": comm_s, "exposed_s": exposed,
            "step_s": step, "share": (hook_s + exposed) / step if step else 0.0}


def run_step(predicted: dict, name: str, cost: HookCost) -> float:
    """Mean step over the steps left, counting plain-gradient steps at the plain hook's cost."""
    plain = min(cost.plain_steps.get(name, 0), cost.steps_left)
    if not plain or "none" not in predicted:
        return predicted[name]["step_s"]
    left = max(cost.steps_left, 1)
    return (plain * predicted["none"]["step_s"]
            + (left - plain) * predicted[name]["step_s"]) / left


def choose_comm(link: LinkEstimate, compute_s: float, grad_accum: int, traffic: GradTraffic,
                world_size: int, hooks: tuple[str, ...] = HOOK_NAMES,
                cost: HookCost | None = None, auto_periodic: bool = False) -> CommDecision:
    """Apply the model above to each of `hooks` and pick the least lossy one within budget;
    the periodic methods among `hooks` only with `auto_periodic`.

    Needs world_size > 1: a single process has nothing to send (the trainer decides that itself).
    """
    cost = cost or HookCost()
    grad_bytes, buckets = traffic.grad_bytes, traffic.buckets
    powersgd_bytes, powersgd_buckets = traffic.powersgd_bytes, traffic.powersgd_buckets
    common = dict(link=link, compute_s=compute_s, grad_bytes=grad_bytes, buckets=buckets,
                  world_size=world_size)
    wire = {"none": grad_bytes, "bf16": grad_bytes // 2, "fp16": grad_bytes // 2,
            "powersgd": powersgd_bytes}
    # PowerSGD runs three dependent all-reduces per bucket (uncompressed part, P, then Q).
    rounds = {"none": 1, "bf16": 1, "fp16": 1, "powersgd": 3}
    bytes_per_s = max(link.busbw_gbps, 1e-9) * 1e9 / 8
    hideable = BACKWARD_SHARE * compute_s / grad_accum
    candidates = [name for name in HOOK_NAMES if name in hooks]  # least lossy first
    predicted = {}
    for name in candidates:
        n_buckets = (powersgd_buckets or buckets) if name == "powersgd" else buckets
        rate = bytes_per_s * (link.half_rate or {}).get(name, 1.0)
        comm_s = (rounds[name] * n_buckets * link.latency_s
                  + wire[name] * bus_factor(world_size) / rate)
        predicted[name] = {"wire_bytes": wire[name], **predict(
            compute_s, comm_s, hideable, n_buckets, cost.hook_s.get(name, 0.0))}
    for name in candidates:
        predicted[name]["run_step_s"] = run_step(predicted, name, cost)
    # Then the methods that sync every H steps (trainer/comm/periodic.py): always priced and logged;
    # candidates with auto_periodic, when the steps left hold two of their intervals.
    periodic = {name: p for name, p in predict_periodic(
        link, compute_s, grad_bytes, world_size, EXPOSED_BUDGET, cost.steps_left,
        MIN_AUTO_SYNC_EVERY).items() if name in hooks}
    predicted.update(periodic)
    usable = [name for name, p in periodic.items() if p["usable"]]
    name, reason = _pick(candidates + usable if auto_periodic else candidates, predicted)
    would, _ = _pick(candidates + usable, predicted)
    if name in periodic:
        reason += _interval_note(periodic[name])
    elif would in periodic:
        p = periodic[would]
        reason += (f"; {would} every {p['sync_every']} steps would be faster "
                   f"({p['run_step_s'] * 1e3:.0f} ms/step), not taken: it changes the optimizer, "
                   f"and [train] auto_periodic is off")
    elif periodic and not usable and predicted[name]["share"] > EXPOSED_BUDGET:
        p = next(iter(periodic.values()))
        off = "" if auto_periodic else ", and [train] auto_periodic is off"
        every = max(p["sync_every_needed"], MIN_AUTO_SYNC_EVERY)
        reason += (f"; no periodic method either: syncing every {every} steps (the budget "
                   f"needs {p['sync_every_needed']}, auto's shortest interval is "
                   f"{MIN_AUTO_SYNC_EVERY}) needs two intervals in the {cost.steps_left} steps "
                   f"left{off}")
    return CommDecision(name, reason, predicted=predicted, **common)


def _pick(candidates: list[str], predicted: dict) -> tuple[str, str]:
    """The least lossy candidate within budget, else the fastest over the steps left."""
    for name in candidates:
        if predicted[name]["share"] <= EXPOSED_BUDGET:
            return name, (f"least lossy hook with predicted hook + exposed comm "
                          f"{predicted[name]['share']:.0%} <= {EXPOSED_BUDGET:.0%} of the step")
    best = min(candidates, key=lambda n: predicted[n]["run_step_s"])
    return best, (f"no hook keeps hook + exposed comm within {EXPOSED_BUDGET:.0%}; "
                  f"{best} is fastest over the steps left "
                  f"({predicted[best]['run_step_s'] * 1e3:.0f} ms/step)")


def _interval_note(p: dict) -> str:
    if p["sync_every_needed"] >= MIN_AUTO_SYNC_EVERY:
        return f" (every {p['sync_every']} steps)"
    return (f" (every {p['sync_every']} steps: the budget needs {p['sync_every_needed']}, but "
            f"auto's shortest interval is {MIN_AUTO_SYNC_EVERY}, where the outer step is tuned)")
