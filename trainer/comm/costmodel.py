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

This module is the model alone, with no torch: `fatpipe plan` prices a cluster that does not
exist yet with the same code (`ops/plan`), and the trainer feeds it what it measured
(`commsetup`: the link from `linkprobe`, the compute and the hooks' own costs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..bandwidth import bus_factor
from ..config import HOOK_NAMES, PERIODIC_NAMES
from .decision import CommDecision, LinkEstimate

EXPOSED_BUDGET = 0.20  # largest share of a step that communication may leave exposed
BACKWARD_SHARE = 2 / 3  # backward's share of forward + backward compute
# The share of a step the exchange between regions may leave exposed (`hiersetup`, the plan):
# INTELLECT-1 kept 96% compute utilization inside the US with DiLoCo between sites.
OUTER_BUDGET = 0.05
# The longest interval comm=auto picks: DiLoCo's own runs use H = 500 (its paper's default).
MAX_SYNC_EVERY = 500
# The shortest interval comm=auto picks (and only with [train] auto_periodic = true): the outer
# learning rate and momentum of `periodic.DiLoCo` were tuned for H near 500, and 50 is the
# smallest interval the DiLoCo paper studies. A shorter one is the user's to ask for (--comm
# diloco --sync-every).
MIN_AUTO_SYNC_EVERY = 50
# int8 with one float32 scale per CHUNK values: what crosses between regions (`quant`).
CHUNK = 4096


def int8_wire_bytes(numel: int) -> int:
    """Bytes one quantized tensor of `numel` values takes: the values and the scales."""
    return numel + 4 * -(-numel // CHUNK)


def powersgd_wire_elements(shapes: Sequence[Sequence[int]], rank: int,
                           min_rate: float = 2.0) -> int:
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
    # Then the methods that sync every H steps (`periodic`, priced below): always priced and logged;
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


def predict_periodic(link: LinkEstimate, compute_s: float, param_bytes: int, world_size: int,
                     budget: float, steps_left: int = 0, min_every: int = 2) -> dict[str, dict]:
    """comm=auto's model for the periodic methods: one prediction per name in PERIODIC_NAMES.

    `link` has busbw_gbps and latency_s (`decision.LinkEstimate`). One sync all-reduces the
    parameters and overlaps nothing: sync_s = latency + bytes x 2(n-1)/n / busbw, all of it
    exposed, once per H steps. H is the smallest interval (>= 2) whose exposed time per step,
    sync_s / H, stays within `budget` of the step: H >= sync_s (1 - budget) / (budget x
    compute_s) (`sync_every_needed`), raised to `min_every`, at most MAX_SYNC_EVERY. `usable`
    is false when the steps left are fewer than two such intervals: the run would be replicas
    trained apart and averaged once, not periodic training (H is then shown at half the steps
    left). The other keys are the hooks'.
    """
    bytes_per_s = max(link.busbw_gbps, 1e-9) * 1e9 / 8
    sync_s = link.latency_s + param_bytes * bus_factor(world_size) / bytes_per_s
    need = max(2, math.ceil(sync_s * (1 - budget) / (budget * max(compute_s, 1e-9)) - 1e-9))
    wanted = min(max(need, min_every), MAX_SYNC_EVERY)
    h = max(2, min(wanted, steps_left // 2)) if steps_left else wanted
    exposed = sync_s / h
    step = compute_s + exposed
    share = exposed / step if step else 0.0
    entry = {"wire_bytes": param_bytes // h, "compute_s": compute_s, "hook_s": 0.0,
             "comm_s": exposed, "exposed_s": exposed, "step_s": step, "run_step_s": step,
             "share": share, "sync_every": h, "sync_every_needed": need, "sync_s": sync_s,
             "usable": h == wanted}
    return {name: dict(entry) for name in PERIODIC_NAMES}
