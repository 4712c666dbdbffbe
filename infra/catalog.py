"""Machine catalogs: each type's baseline bandwidth, price and GPUs, and the pick for a tier.

Offline catalogs ship beside this file (`aws_catalog.json`, `digitalocean_catalog.json`,
each with its date and source). A provider whose API lists its types refreshes its catalog
into `.fatpipe/catalog/<provider>-<region>.json` (`fatpipe catalog aws --region R`), or
`<provider>.json` when the API's answer holds every region (`fatpipe catalog digitalocean`),
which then takes precedence; prices come from the file's own dated, sourced price block (a
refresh keeps the offline table's, or takes the provider API's own), else the offline table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import ConfigError

HERE = Path(__file__).parent

# A type picked automatically must be able to run the trainer: torch alone needs ~1 GiB and
# the data loader a core of its own. An explicitly named type is taken as given.
MIN_VCPUS = 2
MIN_MEMORY_GIB = 4.0


@dataclass(frozen=True)
class MachineType:
    """One machine type as a tier sees it."""

    name: str
    baseline_gbps: float | None  # sustained, not burst; None when the provider does not say
    peak_gbps: float | None
    vcpus: int
    memory_gib: float
    gpus: int = 0
    arch: str = "x86_64"  # x86_64 | arm64
    cluster_placement: bool = True  # AWS: may join a cluster placement group
    price_hourly: float | None = None  # USD, from the offline price table
    # What the provider publishes: a measured "baseline" (AWS), or a "documented limit" that
    # says nothing about what a node sustains (DigitalOcean); netcheck measures either way.
    bandwidth_basis: str = "baseline"
    # Which GPU the type carries (`gpu_kind()`: "t4", "a10g", "h100", ...) and its name as the
    # provider gives it; None: no GPU, or a catalog written before kinds were recorded.
    gpu_kind: str | None = None
    gpu_name: str | None = None

    def bandwidth_text(self) -> str:
        if self.baseline_gbps is None:
            return "unknown baseline"
        text = f"{self.baseline_gbps:g} Gbit/s {self.bandwidth_basis}"
        if self.peak_gbps and self.peak_gbps > self.baseline_gbps:
            text += f", bursts to {self.peak_gbps:g} on credits"
        return text

    def price_text(self) -> str:
        return f"${self.price_hourly:.4f}/h" if self.price_hourly is not None else "price unknown"


@dataclass(frozen=True)
class Catalog:
    provider: str
    date: str
    source: str
    region: str | None  # None: not specific to one region
    prices_date: str
    types: dict[str, MachineType]
    path: Path
    per_node_extras: dict[str, float]  # USD/h each node costs besides its type (public IPv4, ...)
    refreshable: bool = False  # the provider's API can refresh it (`fatpipe catalog P --region R`)
    prices_region: str | None = None  # where the prices hold; None: everywhere

    def qualifying(self, gbps: float, gpus: int = 0) -> list[MachineType]:
        """Types able to run the trainer whose baseline reaches `gbps`, cheapest first."""
        found = [
            t for t in self.types.values()
            if t.baseline_gbps is not None and t.baseline_gbps >= gbps
            and t.price_hourly is not None
            and t.vcpus >= MIN_VCPUS and t.memory_gib >= MIN_MEMORY_GIB
            and (t.gpus >= gpus if gpus else t.gpus == 0)
        ]  # fmt: skip
        return sorted(found, key=lambda t: (t.price_hourly, t.name))

    def offline_prices_label(self) -> str:
        where = f" {self.prices_region}" if self.prices_region else ""
        return f"{self.provider}{where} on-demand prices of {self.prices_date}"

    def label(self) -> str:
        where = f" for {self.region}" if self.region else ""
        return f"{self.provider} catalog {self.date}{where} ({self.path.name}); prices {self.prices_date}"


def _machine(name: str, raw: dict, prices: dict[str, float], basis: str) -> MachineType:
    return MachineType(
        name=name,
        baseline_gbps=raw.get("baseline_gbps"),
        peak_gbps=raw.get("peak_gbps"),
        vcpus=int(raw.get("vcpus", 0)),
        memory_gib=float(raw.get("memory_gib", 0)),
        gpus=int(raw.get("gpus", 0)),
        arch=raw.get("arch", "x86_64"),
        cluster_placement=bool(raw.get("cluster_placement", True)),
        price_hourly=prices.get(name, raw.get("price_hourly")),
        bandwidth_basis=basis,
        gpu_kind=raw.get("gpu_kind"),  # absent in catalogs written before kinds were recorded
        gpu_name=raw.get("gpu_name"),
    )


# -- which GPU a type carries -------------------------------------------------------------------

# Words a provider puts around a GPU's model that say nothing of which it is.
_VENDOR_WORDS = re.compile(r"\b(nvidia|amd|tesla|geforce|radeon|instinct)\b")
# Kinds whose memory variants compute at different speeds: (the memory from which, the kind then).
_MEMORY_VARIANTS = {"a100": (79.0, "a100-80gb")}


def gpu_kind(name: str, memory_gib: float | None = None) -> str:
    """A GPU's key in the planner's table (`infra.accelerators.ACCELERATORS`) from the name a
    provider gives it: EC2's GpuInfo "T4" -> "t4", "A10G" -> "a10g", "L40S" -> "l40s";
    DigitalOcean's "nvidia_h100" -> "h100"; "NVIDIA GeForce RTX 4090" -> "rtx4090". An A100 with
    80 GB is "a100-80gb" (EC2 names both A100s alike; their memory bandwidth differs)."""
    words = _VENDOR_WORDS.sub(" ", str(name).lower().replace("_", " "))
    kind = re.sub(r"[^a-z0-9]", "", words)
    floor, variant = _MEMORY_VARIANTS.get(kind, (None, None))
    if floor is not None and memory_gib is not None and memory_gib >= floor:
        return variant
    return kind


@lru_cache(maxsize=8)
def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read machine catalog {path}: {e}") from None


def catalog_file(path: Path) -> dict:
    """A catalog file as written (cached; never modify the result)."""
    return _read(path)


def clear_cache() -> None:
    """Forget catalog files read so far (after a refresh rewrote one)."""
    _read.cache_clear()


def offline_path(provider: str) -> Path:
    return HERE / f"{provider}_catalog.json"


def refreshed_path(root: Path, provider: str, region: str | None) -> Path:
    """Where `fatpipe catalog` writes a refreshed catalog inside a project (region None: one
    file for every region)."""
    return Path(root) / ".fatpipe" / "catalog" / (f"{provider}-{region}.json" if region else f"{provider}.json")


def load_catalog(provider: str, region: str | None = None, root: Path | None = None) -> Catalog:
    """The project's refreshed catalog for `region` (else for every region) when there is one,
    else the offline one."""
    offline = _read(offline_path(provider))
    path = offline_path(provider)
    if root is not None:
        found = [p for p in (refreshed_path(root, provider, region), refreshed_path(root, provider, None))
                 if p.is_file()]
        path = found[0] if found else path
    data = _read(path)
    prices = data.get("prices") or offline.get("prices", {})
    hourly = prices.get("hourly", {})
    basis = offline.get("bandwidth_basis", "baseline")
    types = {name: _machine(name, raw, hourly, basis) for name, raw in data["types"].items()}
    return Catalog(
        provider=provider, date=data["date"], source=data["source"], region=data.get("region"),
        prices_date=prices.get("date", "?"),
        types=types, path=path, per_node_extras=dict(prices.get("per_node_extras", {})),
        refreshable=bool(offline.get("refreshable")), prices_region=prices.get("region"),
    )


def machine_for(cluster, root: Path | None = None) -> MachineType:
    """The cluster's machine type: the one it names if that meets its tier, else the cheapest.

    Raises ConfigError naming a type that qualifies when the named one falls short.
    """
    provider, key = cluster.provider, cluster.machine_field
    catalog = load_catalog(provider, cluster.region, root)
    wanted = getattr(cluster, key)  # the field the provider's model names machines by
    gbps, gpus = cluster.tier_gbps, cluster.gpus_per_node
    candidates = catalog.qualifying(gbps, gpus)
    suggestion = _suggest(candidates)
    where = f"clusters.{cluster.name}.{key}"
    if wanted is None:
        if not candidates:
            need = f" with {gpus} GPU(s)" if gpus else ""
            raise ConfigError(
                f"clusters.{cluster.name}: no {provider} type in the {catalog.label()} reaches "
                f"tier {cluster.tier} ({gbps} Gbit/s baseline){need}; choose a lower tier or another provider"
            )
        return candidates[0]
    machine = catalog.types.get(wanted)
    if machine is None:
        refresh = (f"; refresh it with `fatpipe catalog {provider} --region {cluster.region}`"
                   if catalog.refreshable else "")
        raise ConfigError(f"{where}: {wanted} is not in the {catalog.label()}{refresh}. {suggestion}")
    if machine.baseline_gbps is None or machine.baseline_gbps < gbps:
        raise ConfigError(
            f"{where}: {wanted} has {machine.bandwidth_text()}, below tier {cluster.tier} "
            f"({gbps} Gbit/s sustained). {suggestion}"
        )
    if machine.gpus < gpus:
        raise ConfigError(f"{where}: {wanted} has {machine.gpus} GPU(s), gpus_per_node is {gpus}. {suggestion}")
    return machine


def _suggest(candidates: list[MachineType]) -> str:
    if not candidates:
        return "No type in the catalog qualifies."
    best = candidates[0]
    return f"{best.name} qualifies ({best.bandwidth_text()}, {best.price_text()})."


# -- what a cluster costs ------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """A cluster's machine, its baseline bandwidth and the estimated price of all its nodes."""

    machine: str
    baseline_gbps: float | None
    hourly: float | None  # USD for the whole cluster; None when the price table lacks the type
    prices: str  # which price table, and its date
    bandwidth_basis: str = "baseline"
    extras: tuple[str, ...] = ()  # what the hourly price counts besides the machines


def estimate(cluster, root: Path | None = None) -> Estimate:
    """The machine a cloud `cluster` gets and what its nodes cost per hour, from its catalog."""
    machine = machine_for(cluster, root)
    catalog = load_catalog(cluster.provider, cluster.region, root)
    prices = catalog.offline_prices_label()
    hourly = None
    if machine.price_hourly is not None:
        hourly = (machine.price_hourly + sum(catalog.per_node_extras.values())) * cluster.nodes
    return Estimate(machine.name, machine.baseline_gbps, hourly, prices, machine.bandwidth_basis,
                    tuple(catalog.per_node_extras))
