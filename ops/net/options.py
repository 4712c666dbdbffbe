"""What a netcheck measures: `NetcheckOptions` (the sweep, or the quick check's one size from the
tier), the netbench command line it gives, and a bound on how long that takes."""

from __future__ import annotations

from dataclasses import dataclass

from fatpipe.infra.defaults import P2P_TOOLS
from fatpipe.infra.errors import FatpipeError

from .gate import DEFAULT_MIN_FRACTION, fmt_size

NETBENCH_MODULE = "fatpipe.trainer.net.bench"
MiB = 1 << 20
FULL_MIN_SIZE, FULL_MAX_SIZE = 1 * MiB, 256 * MiB
# The quick check measures one size: the one the gate and comm=auto read, large enough that one
# all-reduce lasts this long at the tier, so the link's rate, not its latency (about 1 ms on gloo),
# sets its time (32 MiB at 1 Gbit/s on 4 nodes; docs/BENCHMARKS.md, "Issue 35").
QUICK_ALLREDUCE_S = 0.25
STARTUP_ALLOWANCE_S = 180  # torchrun and torch start-up on every node, rendezvous, process group


@dataclass(frozen=True)
class NetcheckOptions:
    """What to measure and how to judge it."""

    min_fraction: float = DEFAULT_MIN_FRACTION  # of the tier, for busbw and every pair
    enforce: bool = True  # False (--no-gate): report, never fail
    min_size: int | None = None  # default 1 MiB; with `quick` the largest size only
    max_size: int | None = None  # default 256 MiB; with `quick` from the tier (`quick_size`)
    quick: bool = False  # one size (`quick_size`), few iterations, one 1 s multi-stream p2p run per node
    streams: int = 4  # parallel TCP streams of the multi-stream p2p test
    p2p_seconds: float = 3.0
    p2p_port: int | None = None  # default: the cluster's rdzv_port + 1
    p2p_tool: str = "auto"  # auto | iperf3 | socket
    timeout_s: float | None = None  # default: estimated from the sizes and the tier
    pairs: bool = False  # also every node pair, in rounds of disjoint pairs (the link matrix)
    force: bool = False  # go on though a node of the latest run cannot be reached (it may run it)

    def __post_init__(self):
        if self.max_size is None and not self.quick:
            object.__setattr__(self, "max_size", FULL_MAX_SIZE)
        if self.min_size is None and not self.quick:
            object.__setattr__(self, "min_size", FULL_MIN_SIZE)
        if not 0 < self.min_fraction <= 1:
            raise FatpipeError(f"min fraction {self.min_fraction} must be in (0, 1]", exit_code=2)
        if None not in (self.min_size, self.max_size) and self.max_size < self.min_size:
            raise FatpipeError(f"max size {fmt_size(self.max_size)} is below min size {fmt_size(self.min_size)}",
                               exit_code=2)
        if self.streams < 1:
            raise FatpipeError("streams must be at least 1", exit_code=2)
        if self.p2p_tool not in P2P_TOOLS:
            raise FatpipeError(f"p2p tool {self.p2p_tool!r}: allowed {', '.join(P2P_TOOLS)}", exit_code=2)

    @property
    def seconds_per_p2p(self) -> float:
        return 1.0 if self.quick else self.p2p_seconds

    def sizes(self, nnodes: int, tier_gbps: float) -> tuple[int, int]:
        """(smallest, largest) all-reduce: the sweep's, or with `quick` one size for the tier unless given."""
        if not self.quick:
            return self.min_size, self.max_size
        largest = self.max_size or max(quick_size(nnodes, tier_gbps), self.min_size or 0)
        return self.min_size or largest, largest

    def netbench_args(self, outputs, out: str) -> list[str]:
        port = self.p2p_port or outputs.rdzv_port + 1
        min_size, max_size = self.sizes(len(outputs.nodes), outputs.tier_gbps)
        args = [
            "-m", NETBENCH_MODULE, "--out", out,
            "--min-size", str(min_size), "--max-size", str(max_size),
            "--p2p-server", outputs.nodes[0].private_ip, "--p2p-port", str(port),
            "--p2p-tool", self.p2p_tool, "--p2p-seconds", f"{self.seconds_per_p2p:g}",
            "--streams", str(self.streams),
        ]
        if self.quick:  # one multi-stream run per node: the link's capacity, which the gate judges
            args += ["--quick", "--no-single-flow"]
        return args + (["--pairs"] if self.pairs else [])

    def estimate_s(self, nnodes: int, tier_gbps: float) -> float:
        """A generous bound on the benchmark's run time: the sweep at half the tier, p2p, start-up."""
        sweep_bytes, (size, max_size) = 0, self.sizes(nnodes, tier_gbps)
        while size <= max_size:
            sweep_bytes += size * 30  # at most 5 warm-up + 20 timed iterations, +20%
            size *= 2
        factor = 2 * (nnodes - 1) / nnodes
        sweep_s = sweep_bytes * factor * 8 / (0.5 * tier_gbps * 1e9)
        p2p_s = (nnodes - 1) * 2 * (self.seconds_per_p2p + 15)
        rounds = nnodes - 1 if nnodes % 2 == 0 else nnodes  # the round-robin schedule's length
        pairs_s = rounds * (2 * (self.seconds_per_p2p + 15) + 20) if self.pairs else 0.0
        return STARTUP_ALLOWANCE_S + sweep_s + p2p_s + pairs_s


def quick_size(nnodes: int, tier_gbps: float) -> int:
    """The quick check's one size: the smallest power of two from 1 MiB whose all-reduce lasts
    QUICK_ALLREDUCE_S at the tier's rate (bus factor 2(n-1)/n), at most the sweep's largest."""
    factor = 2 * (nnodes - 1) / nnodes if nnodes > 1 else 1.0
    wanted = QUICK_ALLREDUCE_S * tier_gbps * 1e9 / 8 / factor
    size = FULL_MIN_SIZE
    while size < wanted and size < FULL_MAX_SIZE:
        size *= 2
    return size
