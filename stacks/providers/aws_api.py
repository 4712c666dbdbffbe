"""The EC2 API: the preflight before a deploy, and the catalog refreshed from what a region offers.

Preflight: credentials work, the type is offered in every region of the cluster, its baseline
meets the tier.
"""

from __future__ import annotations

import contextlib
import re
from datetime import date
from pathlib import Path

from fatpipe.infra.catalog import (
    catalog_file,
    clear_cache,
    gpu_kind,
    load_catalog,
    machine_for,
    offline_path,
    refreshed_path,
)
from fatpipe.infra.catalogdiff import changes, priced, select
from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.files import write_json_atomic
from fatpipe.infra.lazy import load


def preflight(cluster, root: Path | None = None, session=None) -> None:
    """Raise FatpipeError with a one-line reason if `cluster` cannot be deployed as declared.

    Asks the EC2 API rather than the offline catalog, so a type that is new, retired or
    missing in the region is caught before terraform creates half a cluster.
    """
    errors = load("botocore.exceptions")
    session = session or load("boto3").session.Session(region_name=cluster.region)
    if session.get_credentials() is None:
        raise FatpipeError(
            "no AWS credentials found: set AWS_PROFILE (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), "
            "or run `aws configure`"
        )
    name = cluster.instance_type or machine_for(cluster, root).name
    where = cluster.region
    try:
        session.client("sts", region_name=cluster.region).get_caller_identity()  # creds accepted?
        for where in cluster.node_regions:  # one type for every region: each must offer it
            _check_offered(session.client("ec2", region_name=where), cluster, name, where)
        where = cluster.region
        ec2 = session.client("ec2", region_name=cluster.region)
        info = ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"][0]
    except errors.ClientError as e:
        error = e.response.get("Error", {})
        raise FatpipeError(
            f"AWS refused the preflight for {cluster.name} in {where}: "
            f"{error.get('Code', '?')}: {error.get('Message', e)}"
        ) from None
    except errors.BotoCoreError as e:
        raise FatpipeError(f"AWS preflight for {cluster.name} failed: {e}") from None
    record = aws_type_record(info)
    baseline = record["baseline_gbps"]
    if baseline is None or baseline < cluster.tier_gbps:
        have = "an unknown baseline" if baseline is None else f"a baseline of {baseline:g} Gbit/s"
        raise FatpipeError(
            f"{name} has {have} ({record['network']} is its burst rating), below tier {cluster.tier} "
            f"({cluster.tier_gbps} Gbit/s); {_qualifying(cluster, root, name)}"
        )


@contextlib.contextmanager
def api_errors(refused: str, unreachable: str):
    """botocore's errors as one line: `refused` (with AWS's code and message) or `unreachable`."""
    errors = load("botocore.exceptions")
    try:
        yield
    except errors.NoCredentialsError:
        raise FatpipeError("no AWS credentials found: set AWS_PROFILE or run `aws configure` "
                           "(or use --offline)") from None
    except errors.ClientError as e:
        error = e.response.get("Error", {})
        raise FatpipeError(f"{refused}: {error.get('Code')}: {error.get('Message')}") from None
    except errors.BotoCoreError as e:
        raise FatpipeError(f"{unreachable}: {e}") from None


def console_output(region: str, instance_id: str, session=None) -> str | None:
    """The instance's console text (GetConsoleOutput: an authenticated API; cloud-init prints
    the SSH host keys there); None while there is none yet."""
    ec2 = (session or load("boto3").session.Session(region_name=region)).client("ec2", region_name=region)
    with api_errors(f"AWS refused the console output of {instance_id}", f"cannot reach EC2 in {region}"):
        try:  # Latest: what the console shows now (Nitro); older instances only have the buffered copy
            return ec2.get_console_output(InstanceId=instance_id, Latest=True).get("Output")
        except load("botocore.exceptions").ClientError as e:
            if e.response.get("Error", {}).get("Code") != "UnsupportedOperation":
                raise
            return ec2.get_console_output(InstanceId=instance_id).get("Output")


def _check_offered(ec2, cluster, name: str, region: str) -> None:
    location, where = region, "region"
    if cluster.availability_zone:  # a cluster of one region only
        location, where = cluster.availability_zone, "availability-zone"
    offered = offered_types(ec2, where, location)
    if name not in offered:
        fix = f"run `fatpipe catalog aws --region {region}` so the automatic pick knows what it offers"
        raise FatpipeError(
            f"{name} is not offered in {location}; {_qualifying(cluster, None, name, offered)}; "
            f"set instance_type, or {fix}"
        )


def _qualifying(cluster, root: Path | None, refused: str, offered: set[str] | None = None) -> str:
    catalog = load_catalog("aws", cluster.region, root)
    candidates = [t for t in catalog.qualifying(cluster.tier_gbps, cluster.gpus_per_node)
                  if t.name != refused and (offered is None or t.name in offered)]
    if not candidates:
        return "no type in the catalog qualifies"
    best = candidates[0]
    there = " and is offered there" if offered is not None else ""
    return f"{best.name} qualifies ({best.bandwidth_text()}, {best.price_text()}){there}"


# -- refreshing the AWS catalog from the EC2 API ----------------------------------------------

_RATING = re.compile(r"^(Up to )?([\d.]+) Gigabit$")


def rating_gbps(text: str | None) -> tuple[float | None, float | None]:
    """(baseline, peak) from a NetworkPerformance text: "25 Gigabit" is fixed (both 25); "Up to
    25 Gigabit" is a burst ceiling (baseline unknown, peak 25); "Moderate" and the like say neither."""
    m = _RATING.match((text or "").strip())
    if not m:
        return None, None
    rate = float(m.group(2))
    return (None, rate) if m.group(1) else (rate, rate)


def card_record(card: dict, fallback_text: str | None = None) -> dict:
    """One network card's baseline and peak; its rating text where the API gives no figures."""
    baseline, peak = card.get("BaselineBandwidthInGbps"), card.get("PeakBandwidthInGbps")
    text = card.get("NetworkPerformance") or fallback_text
    if baseline is None:
        baseline, rated_peak = rating_gbps(text)
        peak = peak if peak is not None else rated_peak
    return {"index": card.get("NetworkCardIndex", 0), "baseline_gbps": baseline, "peak_gbps": peak,
            "network": text}


def aws_type_record(info: dict) -> dict:
    """One DescribeInstanceTypes entry reduced to what a tier needs.

    Every network card keeps its baseline and peak; the type's baseline is the default card's
    (fatpipe attaches one interface). Without per-card figures the NetworkPerformance text is
    parsed: a fixed "N Gigabit" is the baseline, "Up to N Gigabit" only a burst ceiling, so the
    baseline stays unknown and the type never qualifies for a tier.
    """
    net = info.get("NetworkInfo", {})
    text = net.get("NetworkPerformance")
    cards = [card_record(c, text) for c in net.get("NetworkCards", [])] or [card_record({}, text)]
    default = next((c for c in cards if c["index"] == net.get("DefaultNetworkCardIndex", 0)), cards[0])
    arches = info.get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])
    strategies = info.get("PlacementGroupInfo", {}).get("SupportedStrategies", ["cluster"])
    return {
        "baseline_gbps": default["baseline_gbps"],
        "peak_gbps": default["peak_gbps"],
        "network": text,
        "network_cards": [{k: v for k, v in c.items() if k != "network"} for c in cards],
        "ena": net.get("EnaSupport", "unsupported"),
        "vcpus": info.get("VCpuInfo", {}).get("DefaultVCpus", 0),
        "memory_gib": round(info.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024, 3),
        **gpu_record(info.get("GpuInfo") or {}),
        "arch": "arm64" if "arm64" in arches else arches[0],
        "cluster_placement": "cluster" in strategies,
    }


def gpu_record(info: dict) -> dict:
    """A GpuInfo's GPUs: their count and, where it has any, which GPU (`gpu_kind`, the planner's
    key), the name EC2 gives it and each GPU's memory. A type with a share of one GPU (g6f:
    Count 0, GpuPartitionSize 0.125) keeps its kind and the share as `gpu_fraction`."""
    gpus = info.get("Gpus") or []
    record: dict = {"gpus": sum(int(g.get("Count") or 0) for g in gpus)}
    if not gpus:
        return record
    memory = [(g.get("MemoryInfo") or {}).get("SizeInMiB", 0) / 1024 for g in gpus]
    kinds = sorted({gpu_kind(g.get("Name", ""), m) for g, m in zip(gpus, memory, strict=True)})
    record["gpu_kind"] = "+".join(kinds)  # one kind in every type EC2 lists; several stay unplanned
    record["gpu_name"] = " + ".join(f"{g.get('Manufacturer', '')} {g.get('Name', '')}".strip() for g in gpus)
    record["gpu_memory_gib"] = round(max(memory), 3)
    fraction = min(float(g.get("GpuPartitionSize") or 1.0) for g in gpus)
    if fraction < 1.0:
        record["gpu_fraction"] = fraction
    return record


def offered_types(client, location_type: str, location: str) -> set[str]:
    """The instance types EC2 offers at `location` ("region" or "availability-zone")."""
    offered: set[str] = set()
    pages = client.get_paginator("describe_instance_type_offerings").paginate(
        LocationType=location_type, Filters=[{"Name": "location", "Values": [location]}]
    )
    for page in pages:
        offered.update(o["InstanceType"] for o in page["InstanceTypeOfferings"])
    return offered


def fetch_aws_types(region: str, client=None, types: tuple[str, ...] = (),
                    families: tuple[str, ...] = ()) -> dict[str, dict]:
    """The instance types offered in `region` (those of `types`/`families` when given), as
    catalog records; both EC2 calls paginated."""
    if client is None:
        # A session of its own: boto3's default one keeps the credentials it found first.
        client = load("boto3").session.Session(region_name=region).client("ec2", region_name=region)
    wanted = select(sorted(offered_types(client, "region", region)), types, families)
    records: dict[str, dict] = {}
    for start in range(0, len(wanted), 100):  # DescribeInstanceTypes takes 100 names a call
        pages = client.get_paginator("describe_instance_types").paginate(InstanceTypes=wanted[start:start + 100])
        for page in pages:
            records.update((info["InstanceType"], aws_type_record(info)) for info in page["InstanceTypes"])
    return dict(sorted(records.items()))


def refresh_aws_catalog(region: str, root: Path, client=None, types: tuple[str, ...] = (),
                        families: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
    """Fetch the types offered in `region` and write the project's refreshed AWS catalog
    atomically, with the offline table's dated prices; return its path and what changed
    against the catalog in use before."""
    records = fetch_aws_types(region, client, types, families)
    if not records:
        raise ConfigError(f"EC2 reported no instance types offered in {region}")
    before = load_catalog("aws", region, root)
    records, prices = priced(records, catalog_file(offline_path("aws")).get("prices", {}))
    chosen = (f" limited to types {', '.join(types)}" if types else "") + \
        (f" limited to families {', '.join(families)}" if families else "")
    doc = {
        "provider": "aws",
        "date": date.today().isoformat(),
        "region": region,
        "source": f"EC2 DescribeInstanceTypes + DescribeInstanceTypeOfferings in {region}{chosen}",
        "prices": prices,
        "types": records,
    }
    path = refreshed_path(root, "aws", region)
    old = catalog_file(before.path)["types"]
    write_json_atomic(path, doc)
    clear_cache()
    return path, changes(old, records)
