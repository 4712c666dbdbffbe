"""Before an AWS deploy: credentials work, the type is offered there, its baseline meets the tier."""

from __future__ import annotations

from pathlib import Path

from .catalog import aws_type_record, load_catalog, machine_for, offered_types
from .errors import FatpipeError


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
