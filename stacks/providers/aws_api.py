"""The EC2 API: the preflight before a deploy, and the catalog refreshed from what a region offers.

Preflight: credentials work, the type is offered there, its baseline meets the tier.
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

from fatpipe.infra.catalog import clear_cache, load_catalog, machine_for, refreshed_path
from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.files import write_json_atomic


def preflight(cluster, root: Path | None = None, session=None) -> None:
    """Raise FatpipeError with a one-line reason if `cluster` cannot be deployed as declared.

    Asks the EC2 API rather than the offline catalog, so a type that is new, retired or
    missing in the region is caught before terraform creates half a cluster.
    """
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    session = session or boto3.session.Session(region_name=cluster.region)
    if session.get_credentials() is None:
        raise FatpipeError(
            "no AWS credentials found: set AWS_PROFILE (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), "
            "or run `aws configure`"
        )
    name = cluster.instance_type or machine_for(cluster, root).name
    try:
        session.client("sts", region_name=cluster.region).get_caller_identity()  # creds accepted?
        ec2 = session.client("ec2", region_name=cluster.region)
        _check_offered(ec2, cluster, name)
        info = ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"][0]
    except ClientError as e:
        error = e.response.get("Error", {})
        raise FatpipeError(
            f"AWS refused the preflight for {cluster.name} in {cluster.region}: "
            f"{error.get('Code', '?')}: {error.get('Message', e)}"
        ) from None
    except BotoCoreError as e:
        raise FatpipeError(f"AWS preflight for {cluster.name} failed: {e}") from None
    record = aws_type_record(info)
    baseline = record["baseline_gbps"]
    if baseline is None or baseline < cluster.tier_gbps:
        have = "an unknown baseline" if baseline is None else f"a baseline of {baseline:g} Gbit/s"
        raise FatpipeError(
            f"{name} has {have} ({record['network']} is its burst rating), below tier {cluster.tier} "
            f"({cluster.tier_gbps} Gbit/s); {_qualifying(cluster, root, name)}"
        )


def _check_offered(ec2, cluster, name: str) -> None:
    location, where = cluster.region, "region"
    if cluster.availability_zone:
        location, where = cluster.availability_zone, "availability-zone"
    offered = offered_types(ec2, where, location)
    if name not in offered:
        fix = f"run `fatpipe catalog aws --region {cluster.region}` so the automatic pick knows what it offers"
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

_GBIT = re.compile(r"^([\d.]+) Gigabit$")


def aws_type_record(info: dict) -> dict:
    """One DescribeInstanceTypes entry reduced to what a tier needs.

    Baseline comes from the default network card (fatpipe attaches one interface). Types
    without per-card data fall back to a fixed "N Gigabit" rating; "Up to N Gigabit" alone
    is a burst ceiling, so their baseline stays unknown and they never qualify.
    """
    net = info.get("NetworkInfo", {})
    cards = {c.get("NetworkCardIndex", 0): c for c in net.get("NetworkCards", [])}
    card = cards.get(net.get("DefaultNetworkCardIndex", 0), {})
    baseline = card.get("BaselineBandwidthInGbps")
    peak = card.get("PeakBandwidthInGbps")
    if baseline is None:
        fixed = _GBIT.match(net.get("NetworkPerformance", ""))
        baseline = peak = float(fixed.group(1)) if fixed else None
    gpus = sum(g.get("Count", 0) for g in (info.get("GpuInfo") or {}).get("Gpus", []))
    arches = info.get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])
    strategies = info.get("PlacementGroupInfo", {}).get("SupportedStrategies", ["cluster"])
    return {
        "baseline_gbps": baseline,
        "peak_gbps": peak,
        "network": net.get("NetworkPerformance"),
        "vcpus": info.get("VCpuInfo", {}).get("DefaultVCpus", 0),
        "memory_gib": round(info.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024, 3),
        "gpus": gpus,
        "arch": "arm64" if "arm64" in arches else arches[0],
        "cluster_placement": "cluster" in strategies,
    }


def offered_types(client, location_type: str, location: str) -> set[str]:
    """The instance types EC2 offers at `location` ("region" or "availability-zone")."""
    offered: set[str] = set()
    pages = client.get_paginator("describe_instance_type_offerings").paginate(
        LocationType=location_type, Filters=[{"Name": "location", "Values": [location]}]
    )
    for page in pages:
        offered.update(o["InstanceType"] for o in page["InstanceTypeOfferings"])
    return offered


def fetch_aws_types(region: str, client=None) -> dict[str, dict]:
    """Every instance type offered in `region`, as catalog records."""
    if client is None:
        import boto3

        client = boto3.client("ec2", region_name=region)
    wanted = sorted(offered_types(client, "region", region))
    types: dict[str, dict] = {}
    for start in range(0, len(wanted), 100):  # DescribeInstanceTypes takes 100 names a call
        pages = client.get_paginator("describe_instance_types").paginate(InstanceTypes=wanted[start:start + 100])
        for page in pages:
            types.update((info["InstanceType"], aws_type_record(info)) for info in page["InstanceTypes"])
    return dict(sorted(types.items()))


def refresh_aws_catalog(region: str, root: Path, client=None) -> Path:
    """Fetch the types offered in `region` and write the project's refreshed AWS catalog."""
    types = fetch_aws_types(region, client)
    if not types:
        raise ConfigError(f"EC2 reported no instance types offered in {region}")
    doc = {
        "provider": "aws",
        "date": date.today().isoformat(),
        "region": region,
        "source": f"EC2 DescribeInstanceTypes + DescribeInstanceTypeOfferings in {region}",
        "types": types,
    }
    path = refreshed_path(root, "aws", region)
    write_json_atomic(path, doc)
    clear_cache()
    return path
