"""comm = "auto"'s link: netcheck.json when the run has one, else short all-reduce probes now.

Collective probes, the same sizes on every rank (gloo fails otherwise): a small all-reduce for
the latency, a large one for the bus bandwidth, and bf16/fp16 against float32 at equal bytes
(gloo sums half precision on the CPU element by element). What they return is a
`decision.LinkEstimate`, the input `costmodel` prices; `commsetup` takes it there.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .allreduce import measure_allreduce, timed_allreduce
from .decision import LinkEstimate

log = logging.getLogger(__name__)

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
