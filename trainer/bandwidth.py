"""nccl-tests' all-reduce arithmetic and sweep plan: pure, standard library only.

Conventions are nccl-tests': for each size, `time` is the mean time of one all-reduce on the
slowest rank (per-rank times are all-reduced with MAX), algbw = size / time, and
busbw = algbw x 2(n-1)/n, the per-rank traffic of a ring all-reduce, which a link of B bytes/s
caps at B whatever n is. GB = 1e9 bytes; Gbit/s = GB/s x 8, since tiers are in Gbit/s.
Iteration counts are a pure function of the size, so every rank agrees on them (gloo fails
otherwise).

Torch-free on purpose: `fatpipe netcheck` parses sizes on machines without torch, and the
trainer, the comm=auto model and netbench share this arithmetic.
"""

from __future__ import annotations

import re

MiB = 1 << 20
DTYPE_BYTES = 4  # float32: what DDP's gradient buckets hold on CPU
LATENCY_BYTES = 4  # one float: the all-reduce is all latency, no bandwidth
# Timed iterations move about `bytes` per size, within [min, max]: many where they are cheap,
# few at 256 MiB, which takes ~3.2 s on 4 nodes at 1 Gbit/s. The quick sweep (up to 32 MiB)
# still times 4 at its top size: with 2, one stall of a busy CPU moved its result by 10 %.
ITERS_FULL = {"bytes": 256 * MiB, "min": 3, "max": 20}
ITERS_QUICK = {"bytes": 64 * MiB, "min": 4, "max": 10}


def parse_size(text: str | int) -> int:
    """Bytes from `268435456`, `256M`, `256MiB`, `64K` or `1G` (binary units, as nccl-tests)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size such as 1M, 256M or 1048576")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def sweep_sizes(min_size: int, max_size: int) -> list[int]:
    """Powers of two from `min_size` up to `max_size` (both included when `max_size` is one)."""
    if min_size < DTYPE_BYTES or max_size < min_size:
        raise ValueError(f"need {DTYPE_BYTES} <= min size <= max size, got {min_size}, {max_size}")
    sizes, size = [], min_size
    while size <= max_size:
        sizes.append(size)
        size *= 2
    return sizes


def iterations(size: int, quick: bool = False) -> tuple[int, int]:
    """(warm-up, timed) iterations for one size: a pure function, so every rank agrees."""
    rule = ITERS_QUICK if quick else ITERS_FULL
    timed = max(rule["min"], min(rule["max"], rule["bytes"] // size))
    warmup = max(1, min(5, timed // 4))
    return warmup, timed


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus factor 2(n-1)/n: bytes a rank sends per byte of the buffer."""
    return 2 * (world_size - 1) / world_size


def algbw_gbs(size: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes)."""
    return size / seconds / 1e9


def busbw_gbs(size: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: algbw x 2(n-1)/n."""
    return algbw_gbs(size, seconds) * bus_factor(world_size)


def sweep_row(size: int, seconds: float, world_size: int, warmup: int, iters: int) -> dict:
    """One line of the sweep, in nccl-tests' columns plus Gbit/s."""
    alg, bus = algbw_gbs(size, seconds), busbw_gbs(size, seconds, world_size)
    return {
        "size": size, "count": size // DTYPE_BYTES, "type": "float", "redop": "sum",
        "warmup": warmup, "iters": iters, "time_s": seconds,
        "algbw_gbs": alg, "busbw_gbs": bus, "algbw_gbps": alg * 8, "busbw_gbps": bus * 8,
    }


def format_table(rows: list[dict]) -> str:
    lines = [f"#{'size':>11} {'count':>10} {'type':>6} {'redop':>6} {'iters':>6} "
             f"{'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'busbw(Gbit/s)':>14}"]
    for r in rows:
        lines.append(f"{r['size']:>12} {r['count']:>10} {r['type']:>6} {r['redop']:>6} {r['iters']:>6} "
                     f"{r['time_s'] * 1e6:>11.1f} {r['algbw_gbs']:>12.3f} {r['busbw_gbs']:>12.3f} "
                     f"{r['busbw_gbps']:>14.3f}")
    return "\n".join(lines)
