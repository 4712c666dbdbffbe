"""The netcheck gate: do the links deliver the tier? Pure functions over netbench's numbers.

Pass when all-reduce bus bandwidth at the largest size is at least `min_fraction` of the tier,
every node reaches it point-to-point from node 0 and, when measured (`netcheck --pairs`), every
node pair reaches it too. A pair's throughput is the best of its
1-stream and N-stream runs: the link's capacity, whatever one flow's window allows. On a cluster
across regions a pair between regions, and the all-reduce that crosses them, are held to the
declared cross-region rate instead, or only reported without one (docs/netcheck.md, "Regions").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .regions import CrossRegions

DEFAULT_MIN_FRACTION = 0.8


@dataclass(frozen=True)
class PairResult:
    """Node-to-node TCP throughput from `client` to `server`, in Gbit/s per stream count."""

    server: str
    client: str
    gbps_by_streams: dict[int, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def best_gbps(self) -> float:
        return max(self.gbps_by_streams.values(), default=0.0)


@dataclass(frozen=True)
class LinkResult:
    """One node pair of `netcheck --pairs`: throughput per stream count, round-trip latency, jitter."""

    a: str
    b: str
    gbps_by_streams: dict[int, float] = field(default_factory=dict)
    rtt_p50_s: float | None = None
    jitter_s: float | None = None
    error: str | None = None

    @property
    def best_gbps(self) -> float:
        return max(self.gbps_by_streams.values(), default=0.0)

    @property
    def name(self) -> str:
        return f"{self.a} <-> {self.b}"

    def slow(self, threshold_gbps: float) -> bool:
        return bool(self.error) or self.best_gbps < threshold_gbps


def links_from_bench(pairs: dict | None, names: dict[str, str]) -> list[LinkResult]:
    """netbench's `pairs` links as LinkResults, each node named from its private IP where known."""
    if not pairs:
        return []
    return [LinkResult(a=names.get(r["a_ip"]) or r["a"], b=names.get(r["b_ip"]) or r["b"],
                       gbps_by_streams={int(n): float(g) for n, g in r["gbps_by_streams"].items()},
                       rtt_p50_s=r.get("rtt_p50_s"), jitter_s=r.get("jitter_s"), error=r.get("error"))
            for r in pairs["links"]]


def worst_link(links: list[LinkResult]) -> LinkResult | None:
    """A failed link first, else the slowest; ties go to the higher latency."""
    return min(links, key=lambda link: (not link.error, link.best_gbps, -(link.rtt_p50_s or 0.0)),
               default=None)


def shared_node(links: list[LinkResult]) -> str | None:
    """The one node every link touches, when there are two or more links: the likely culprit."""
    if len(links) < 2:
        return None
    common = set.intersection(*({link.a, link.b} for link in links))
    return next(iter(common)) if len(common) == 1 else None


def link_matrix(nodes: list[str], links: list[dict]) -> list[list[dict | None]]:
    """links (each with `a` and `b`) as an n x n matrix in `nodes` order, symmetric, None on the
    diagonal and where a pair was not measured."""
    at = {name: i for i, name in enumerate(nodes)}
    matrix: list[list[dict | None]] = [[None] * len(nodes) for _ in nodes]
    for link in links:
        i, j = at[link["a"]], at[link["b"]]
        matrix[i][j] = matrix[j][i] = link
    return matrix


def link_cell(link: dict) -> tuple[str, str]:
    """A matrix cell's two lines: Gbit/s ("failed" when nothing was measured) and the round-trip
    p50 ± jitter in microseconds."""

    def us(seconds) -> str:
        return "-" if seconds is None else f"{seconds * 1e6:.0f}"

    gbps = "failed" if link["error"] and not link["gbps_by_streams"] else f"{link['best_gbps']:.3f}"
    return gbps, f"{us(link['rtt_p50_s'])} ± {us(link['jitter_s'])}"


@dataclass(frozen=True)
class Bars:
    """The bar a node pair is held to: the tier's inside a region; across regions the declared
    cross-region rate's, or none (the pair is reported, not judged)."""

    tier_gbps: float
    min_fraction: float
    regions: CrossRegions | None = None

    @property
    def tier(self) -> tuple[float, str]:
        return self.min_fraction * self.tier_gbps, f"{self.min_fraction:.2f} x {self.tier_gbps:g} Gbit/s"

    @property
    def cross(self) -> tuple[float, str] | None:
        gbps = self.regions.gbps if self.regions else None
        return None if gbps is None else (self.min_fraction * gbps,
                                          f"{self.min_fraction:.2f} x {gbps:g} Gbit/s across regions")

    def of(self, a: str, b: str) -> tuple[float, str] | None:
        return self.cross if self.regions and self.regions.crosses(a, b) else self.tier

    def ring(self) -> tuple[float, str] | None:
        """The all-reduce's bar: the tier's in one region. Across regions none: a flat ring puts
        several of gloo's flows on the one link between regions in each direction (0.1 of a
        0.4 Gbit/s link on the sim's), which says how a flat ring fares, not what the link
        carries; the pairs judge that."""
        return None if self.regions and self.regions.spans else self.tier

    def slow(self, link: LinkResult | PairResult) -> bool:
        """Failed, or below its bar (never a pair that is only reported)."""
        ends = (link.a, link.b) if isinstance(link, LinkResult) else (link.server, link.client)
        bar = self.of(*ends)
        return bool(link.error) or (bar is not None and link.best_gbps < bar[0])


UNJUDGED = "not judged: the cluster declares no cross_region_gbps"


@dataclass(frozen=True)
class GateResult:
    passed: bool
    threshold_gbps: float
    reasons: list[str]
    notes: list[str] = field(default_factory=list)  # across regions with no declared rate: reported

    def to_json(self) -> dict:
        return asdict(self)


def fmt_gbps(value: float) -> str:
    return f"{value:.2f}"


def fmt_size(nbytes: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}iB"
    return f"{nbytes} B"


def evaluate_gate(
    tier_gbps: float,
    busbw_gbps: float | None,
    busbw_size: int | None,
    pairs: list[PairResult],
    min_fraction: float = DEFAULT_MIN_FRACTION,
    nnodes: int = 2,
    links: list[LinkResult] = (),
    regions: CrossRegions | None = None,
) -> GateResult:
    """The verdict and, when it fails, one reason per slow node or pair, each with its numbers."""
    if not 0 < min_fraction <= 1.5:
        raise ValueError(f"min_fraction {min_fraction} must be in (0, 1.5]")
    bars = Bars(tier_gbps, min_fraction, regions)
    reasons: list[str] = []
    notes: list[str] = []
    for pair in pairs:
        held = bars.of(pair.server, pair.client)
        if pair.error:
            reasons.append(f"node {pair.client}: p2p to {pair.server} failed: {pair.error}")
        elif held is None:
            notes.append(f"node {pair.client}: p2p {fmt_gbps(pair.best_gbps)} Gbit/s to {pair.server} {UNJUDGED}")
        elif pair.best_gbps < held[0]:
            detail = ", ".join(f"{n} stream{'s' if n > 1 else ''} {fmt_gbps(g)}"
                               for n, g in sorted(pair.gbps_by_streams.items()))
            reasons.append(f"node {pair.client}: p2p {fmt_gbps(pair.best_gbps)} Gbit/s to {pair.server} "
                           f"is below {held[1]} ({detail})")
    for link in links:
        held = bars.of(link.a, link.b)
        if link.error:
            reasons.append(f"link {link.name} failed: {link.error}")
        elif held is None:
            notes.append(f"link {link.name}: {fmt_gbps(link.best_gbps)} Gbit/s {UNJUDGED}")
        elif link.best_gbps < held[0]:
            reasons.append(f"link {link.name}: {fmt_gbps(link.best_gbps)} Gbit/s is below {held[1]}")
    held = bars.ring()
    if nnodes > 1:  # one node: all-reduce crosses no network link, nothing to hold to the tier
        if busbw_gbps is None:
            reasons.append("no all-reduce result")
        elif held is None:
            notes.append(f"all-reduce busbw {fmt_gbps(busbw_gbps)} Gbit/s crosses regions: a flat ring, not judged")
        elif busbw_gbps < held[0]:
            culprit = shared_node([link for link in links if bars.slow(link)])
            slow = sorted({p.client for p in pairs if bars.slow(p)} | ({culprit} - {None}))
            hint = f"; slow: {', '.join(slow)}" if slow else ""
            reasons.append(f"all-reduce busbw {fmt_gbps(busbw_gbps)} Gbit/s at {fmt_size(busbw_size or 0)} "
                           f"is below {held[1]}{hint}")
    return GateResult(passed=not reasons, threshold_gbps=bars.tier[0], reasons=reasons, notes=notes)
