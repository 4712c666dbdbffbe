"""The comm decision as one typed record: the hook chosen, the numbers it was chosen on, and what
the run changed since.

A decision is made once (`costmodel.choose_comm`, a named --comm in `commsetup`) and never grows:
a mid-run re-decision (`redecide`) makes a new record with `dataclasses.replace`. One function
writes it as a plain dict (`decision_payload`: the checkpoint's `comm_decision`, which loads with
`weights_only=True`, and summary.json's), and one reads it back (`read_decision`), from every
layout fatpipe has written:

- schema 0, no `schema` key: the first trainer's (`predicted` entries with wire_bytes, comm_s,
  exposed_s and share only; the step they imply, compute + exposed, is filled in), then the
  re-decision's `since_step`, `switches` (without `probe_s` at first) and `reprobes`, the link's
  `half_rate`, and a script's `switch_refused`;
- schema 1: this module's.

What cannot be read (not a dict, a comm this fatpipe does not know, a field of the wrong type, a
newer schema) raises `DecisionUnreadable`, one line naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ..config import HOOK_NAMES, PERIODIC_NAMES, ConfigError

SCHEMA = 1


class DecisionUnreadable(ConfigError):
    """A comm decision payload this fatpipe cannot read."""


@dataclass(frozen=True)
class LinkEstimate:
    """The link as comm=auto priced it."""

    busbw_gbps: float  # all-reduce bus bandwidth, Gbit/s
    latency_s: float  # one small all-reduce, seconds
    source: str  # "netcheck.json", "probe", or the planner's "catalog baseline"
    # bf16/fp16 all-reduce byte rate over float32's, measured (gloo sums half precision on the
    # CPU element by element: on a busy node it can be slower than float32); missing: 1.0
    half_rate: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Switch:
    """One mid-run switch of hook (`redecide.AutoComm.reprobe`) and the numbers that made it."""

    step: int  # the step after which `to` took over
    from_comm: str  # the hook left ("from" in the payload)
    to: str  # the hook taken
    measured_step_s_p50: float  # the window's step p50 that triggered the re-probe
    predicted_step_s_before: float  # the step predicted for `from_comm` when it was chosen
    repredicted_run_step_s: float  # `from_comm` over the steps left, on the new probe
    predicted_run_step_s: float  # `to` over the steps left, on the new probe
    busbw_gbps: float  # the link as re-probed
    latency_s: float
    probe_s: float | None  # the re-probe's seconds; None in switches written before it was kept
    pause_s: float  # the re-probe and the switch: time outside any step's step_s


@dataclass(frozen=True)
class SwitchRefused:
    """The last re-probe's winner that a script's DDP could not take in place, and why."""

    step: int
    to: str
    why: str


@dataclass(frozen=True)
class CommDecision:
    """The comm a run uses, why, and (comm=auto) the measured numbers and predictions behind it."""

    comm: str  # a hook (HOOK_NAMES) or a periodic method (PERIODIC_NAMES)
    reason: str  # one line: why this comm
    link: LinkEstimate | None = None  # None: a named --comm, nothing measured
    compute_s: float = 0.0  # forward + backward of one step, no communication (slowest rank)
    grad_bytes: int = 0  # the gradient's bytes per step
    buckets: int = 1  # DDP buckets at the run's bucket_cap_mb
    world_size: int = 1
    # candidate -> its predicted step: compute_s, hook_s, wire_bytes, comm_s, exposed_s, step_s,
    # run_step_s (over the steps left), share; a periodic method's also sync_every,
    # sync_every_needed, sync_s and usable (costmodel's docstring and its predict_periodic)
    predicted: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    since_step: int = 0  # the step after which this comm took over (0: from the start)
    switches: tuple[Switch, ...] = ()  # mid-run switches so far, oldest first
    reprobes: int = 0  # mid-run link probes so far
    switch_refused: SwitchRefused | None = None  # the last re-probe's winner, not taken

    @property
    def chosen(self) -> Mapping[str, float] | None:
        """The prediction for the comm in use; None when nothing was predicted (a named hook)."""
        return (self.predicted or {}).get(self.comm)

    def describe(self) -> str:
        lines = [f"comm=auto chose {self.comm}: {self.reason}"]
        if self.link:
            half = "".join(f", {k} x{v:.2f}" for k, v in (self.link.half_rate or {}).items())
            lines.append(f"  link {self.link.busbw_gbps:.3f} Gbit/s busbw{half}, "
                         f"{self.link.latency_s * 1e3:.2f} ms latency ({self.link.source}); "
                         f"compute {self.compute_s * 1e3:.1f} ms/step; "
                         f"grad {self.grad_bytes / 1e6:.1f} MB in {self.buckets} bucket(s); "
                         f"{self.world_size} ranks")
        for name, p in self.predicted.items():
            lines.append(f"  {name:8s} wire {p['wire_bytes'] / 1e6:7.2f} MB  compute "
                         f"{p['compute_s'] * 1e3:6.1f} + hook {p['hook_s'] * 1e3:6.1f} + exposed "
                         f"{p['exposed_s'] * 1e3:7.1f} (comm {p['comm_s'] * 1e3:7.1f}) = step "
                         f"{p['step_s'] * 1e3:7.1f} ms ({p['share']:.0%} overhead); "
                         f"{p['run_step_s'] * 1e3:.1f} ms/step over the steps left"
                         + (f", every {p['sync_every']} steps" if "sync_every" in p else ""))
        return "\n".join(lines)


def decision_payload(d: CommDecision) -> dict:
    """The plain dict a checkpoint and summary.json hold (the keys users and the report read)."""
    out = {"comm": d.comm, "reason": d.reason, "link": asdict(d.link) if d.link else None,
           "compute_s": d.compute_s, "grad_bytes": d.grad_bytes, "buckets": d.buckets,
           "world_size": d.world_size,
           "predicted": {name: dict(p) for name, p in d.predicted.items()},
           "since_step": d.since_step, "switches": [_switch_payload(s) for s in d.switches],
           "reprobes": d.reprobes}
    if d.switch_refused:
        out["switch_refused"] = asdict(d.switch_refused)
    out["schema"] = SCHEMA
    return out


def _switch_payload(s: Switch) -> dict:
    out = asdict(s)
    out = {"step": out.pop("step"), "from": out.pop("from_comm"), **out}
    if s.probe_s is None:
        del out["probe_s"]
    return out


def read_decision(payload: object) -> CommDecision:
    """The record of `payload` as `decision_payload` or any older fatpipe wrote it."""
    if not isinstance(payload, Mapping):
        raise DecisionUnreadable(f"a comm decision is a dict, not {type(payload).__name__}")
    schema = payload.get("schema", 0)
    if not isinstance(schema, int) or isinstance(schema, bool) or not 0 <= schema <= SCHEMA:
        raise DecisionUnreadable(f"comm decision schema {schema!r}: this fatpipe reads "
                                 f"0 to {SCHEMA} (a newer fatpipe wrote it?)")
    r = _Reader(payload, "comm decision")
    comm = r.text("comm")
    if comm not in HOOK_NAMES + PERIODIC_NAMES:
        raise DecisionUnreadable(f"comm decision: comm {comm!r} is none of "
                                 f"{', '.join(HOOK_NAMES + PERIODIC_NAMES)}")
    compute_s = r.num("compute_s", 0.0)
    link = payload.get("link")
    refused = payload.get("switch_refused")
    return CommDecision(
        comm, r.text("reason"), _read_link(link) if link is not None else None, compute_s,
        r.whole("grad_bytes", 0), r.whole("buckets", 1), r.whole("world_size", 1),
        _read_predicted(r.mapping("predicted"), compute_s), r.whole("since_step", 0),
        tuple(_read_switch(s) for s in r.items("switches")), r.whole("reprobes", 0),
        _read_refused(refused) if refused is not None else None)


def _read_link(link: object) -> LinkEstimate:
    r = _Reader(link, "comm decision link")
    half = _Reader(r.mapping("half_rate"), "comm decision link half_rate")
    return LinkEstimate(r.num("busbw_gbps"), r.num("latency_s", 0.0), r.text("source"),
                        {str(k): half.num(k) for k in half.d})


def _read_predicted(predicted: Mapping, compute_s: float) -> dict[str, dict]:
    out = {}
    for name, entry in predicted.items():
        r = _Reader(entry, f"comm decision prediction {name!r}")
        p = {str(k): r.value(k) for k in entry}
        if "step_s" not in p:  # the first model: a step is compute + exposed comm, no hook cost
            r.num("exposed_s")
            p["compute_s"] = p.get("compute_s", compute_s)
            p["hook_s"] = p.get("hook_s", 0.0)
            p["step_s"] = p["compute_s"] + p["hook_s"] + p["exposed_s"]
        p.setdefault("run_step_s", p["step_s"])
        out[str(name)] = p
    return out


def _read_switch(s: object) -> Switch:
    r = _Reader(s, "comm decision switch")
    return Switch(r.whole("step"), r.text("from"), r.text("to"), r.num("measured_step_s_p50"),
                  r.num("predicted_step_s_before"), r.num("repredicted_run_step_s"),
                  r.num("predicted_run_step_s"), r.num("busbw_gbps"), r.num("latency_s"),
                  r.num("probe_s", None), r.num("pause_s"))


def _read_refused(refused: object) -> SwitchRefused:
    r = _Reader(refused, "comm decision switch_refused")
    return SwitchRefused(r.whole("step"), r.text("to"), r.text("why"))


_REQUIRED = object()


class _Reader:
    """Typed fields of one dict in a payload; a missing or mistyped one is one line naming it."""

    def __init__(self, d: object, what: str):
        if not isinstance(d, Mapping):
            raise DecisionUnreadable(f"{what}: a dict, not {type(d).__name__}")
        self.d, self.what = d, what

    def _get(self, key, default, kinds: tuple[type, ...], kind: str):
        value = self.d.get(key, default)
        if value is _REQUIRED:
            raise DecisionUnreadable(f"{self.what}: no {key!r}")
        if value is not default and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise DecisionUnreadable(f"{self.what}: {key!r} is {value!r}, not {kind}")
        return value

    def num(self, key, default=_REQUIRED) -> float:
        return self._get(key, default, (int, float), "a number")

    def value(self, key) -> float | bool:
        """A prediction's figure: a number, or a flag (a periodic method's `usable`)."""
        value = self.d[key]
        if isinstance(value, bool):
            return value
        return self._get(key, _REQUIRED, (int, float), "a number or a flag")

    def whole(self, key, default=_REQUIRED) -> int:
        return self._get(key, default, (int,), "a whole number")

    def text(self, key, default=_REQUIRED) -> str:
        return self._get(key, default, (str,), "text")

    def mapping(self, key) -> Mapping:  # missing or None: empty
        return self._get(key, None, (Mapping,), "a dict") or {}

    def items(self, key) -> list:  # missing or None: empty
        return self._get(key, None, (list, tuple), "a list") or []
