"""The DigitalOcean catalog refreshed from the sizes API (GET /v2/sizes, paged; the token from
DIGITALOCEAN_TOKEN, never from a file, never printed).

The API gives each size's vCPUs, memory, GPUs (which one: `gpu_info.model`, else the slug, as in
gpu-h100x1-80gb), regions and prices, but no bandwidth: that is
DigitalOcean's documented limit (the offline catalog's source: 10 Gbit/s for Premium CPUs, 2 for
all others), applied here by the size's CPU class, so the catalog keeps saying "documented limit".
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

from fatpipe.infra.catalog import (
    catalog_file,
    clear_cache,
    gpu_kind,
    load_catalog,
    offline_path,
    refreshed_path,
)
from fatpipe.infra.catalogdiff import changes, priced, select
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_json_atomic

from .digitalocean_api import DigitalOceanApi

PREMIUM_GBPS, REGULAR_GBPS = 10.0, 2.0
PREMIUM_SUFFIXES = ("-amd", "-intel")  # Premium AMD / Premium Intel slugs


def size_record(size: dict) -> dict:
    """One /v2/sizes entry as a catalog record."""
    slug = str(size.get("slug", ""))
    premium = "premium" in str(size.get("description", "")).lower() or slug.endswith(PREMIUM_SUFFIXES)
    gbps = PREMIUM_GBPS if premium else REGULAR_GBPS
    return {"baseline_gbps": gbps, "peak_gbps": gbps, "vcpus": int(size.get("vcpus") or 0),
            "memory_gib": round(float(size.get("memory") or 0) / 1024, 3),
            **gpu_record(size), "arch": "x86_64",
            "cpu": "premium" if premium else "regular"}


# A GPU size's slug names its GPU, their count and their memory together: gpu-h100x8-640gb.
_GPU_SLUG = re.compile(r"^gpu-(?P<kind>[a-z0-9]+?)x(?P<count>\d+)-(?P<memory>\d+)gb$")


def gpu_record(size: dict) -> dict:
    """A size's GPUs: their count and, where it has any, which GPU (`gpu_kind`, the planner's
    key) and each one's memory, from the API's `gpu_info` (model, count, vram), else the slug."""
    gpu = size.get("gpu_info") or {}
    slug = _GPU_SLUG.match(str(size.get("slug", "")))
    count = int(gpu.get("count") or (slug and slug["count"]) or 0)
    record: dict = {"gpus": count}
    model = gpu.get("model") or (slug and slug["kind"])
    if not count or not model:
        return record
    vram, memory = gpu.get("vram") or {}, None
    if vram.get("amount") and str(vram.get("unit", "gib")).lower() in ("gib", "gb"):
        memory = float(vram["amount"])
    elif slug:
        memory = int(slug["memory"]) / int(slug["count"])
    record["gpu_kind"] = gpu_kind(model, memory)
    record["gpu_name"] = str(gpu.get("model") or size.get("description") or model)
    if memory is not None:
        record["gpu_memory_gib"] = round(memory, 3)
    return record


def refresh_digitalocean_catalog(region: str | None, root: Path, api: DigitalOceanApi | None = None,
                                 types: tuple[str, ...] = (), families: tuple[str, ...] = ()
                                 ) -> tuple[Path, list[str]]:
    """Fetch the sizes available (in `region`, else anywhere), write the project's refreshed
    catalog atomically with the API's own prices, dated today; return it and what changed."""
    api = api or DigitalOceanApi.from_env()
    sizes = {s.get("slug"): s for s in api.get_all("/v2/sizes", "sizes")
             if s.get("slug") and s.get("available") and (region is None or region in (s.get("regions") or []))}
    if not sizes:
        raise FatpipeError(f"the DigitalOcean API lists no size available in {region or 'any region'}")
    wanted = select(sorted(sizes), types, families)
    today = date.today().isoformat()
    api_prices = {"date": today, "region": None,
                  "source": f"DigitalOcean API GET /v2/sizes price_hourly, {today} (USD per hour)",
                  "hourly": {n: float(sizes[n]["price_hourly"]) for n in wanted
                             if sizes[n].get("price_hourly") is not None}}
    before = load_catalog("digitalocean", region, root)
    records, prices = priced({n: size_record(sizes[n]) for n in wanted}, api_prices)
    offline = catalog_file(offline_path("digitalocean"))
    doc = {"provider": "digitalocean", "bandwidth_basis": offline.get("bandwidth_basis", "documented limit"),
           "date": today, "region": region,
           "source": f"DigitalOcean API GET /v2/sizes ({region or 'every region'}); bandwidth: "
                     + offline["source"],
           "prices": prices, "types": records}
    path = refreshed_path(root, "digitalocean", region)
    old = catalog_file(before.path)["types"]
    write_json_atomic(path, doc)
    clear_cache()
    return path, changes(old, records)
