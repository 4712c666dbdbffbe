"""Machine catalogs, the pick for a tier, the AWS refresh and preflight (moto: AWS's real type data)."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra import catalog
from fatpipe.infra.clusters import AwsCluster, DigitalOceanCluster
from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.stacks.providers import aws_api


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "id.pub"
    path.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITest test\n")
    return str(path)


def aws(key, **kw):
    fields = dict(provider="aws", name="east", region="us-east-1", nodes=2, tier="10g",
                  ssh_public_key=key, ssh_cidr="203.0.113.7/32")
    return AwsCluster(**{**fields, **kw})


def do(key, **kw):
    fields = dict(provider="digitalocean", name="sea", region="nyc3", nodes=2, tier="1g",
                  ssh_public_key=key, ssh_cidr="203.0.113.7/32")
    return DigitalOceanCluster(**{**fields, **kw})


@pytest.fixture
def aws_env(monkeypatch):
    """Fake credentials for moto, and no way to reach the real AWS or the instance metadata."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def mocked(aws_env):
    from moto import mock_aws

    with mock_aws():
        yield


# -- offline catalogs ---------------------------------------------------------------------------

def test_offline_catalogs_are_dated_and_sourced():
    for provider in ("aws", "digitalocean"):
        data = json.loads(catalog.offline_path(provider).read_text())
        assert data["date"] and data["source"] and data["prices"]["date"] and data["prices"]["source"]
        assert set(data["prices"]["hourly"]) <= set(data["types"])
    aws_types = catalog.load_catalog("aws").types
    assert len(aws_types) > 100
    # "Up to 25 Gigabit" is a burst ceiling: c5n.large sustains 3.
    assert (aws_types["c5n.large"].baseline_gbps, aws_types["c5n.large"].peak_gbps) == (3.0, 25.0)
    assert aws_types["c5n.18xlarge"].baseline_gbps == 100.0
    assert aws_types["g4dn.xlarge"].gpus == 1 and aws_types["c7gn.large"].arch == "arm64"


def test_cheapest_qualifying_type_is_picked_on_baseline(key):
    assert catalog.machine_for(aws(key, tier="1g")).name == "c6gn.large"
    assert catalog.machine_for(aws(key, tier="10g")).name == "c7gn.xlarge"
    assert catalog.machine_for(aws(key, tier="25g")).name == "c7gn.2xlarge"
    assert catalog.machine_for(aws(key, tier="10g", gpus_per_node=1)).name == "g4dn.2xlarge"
    assert catalog.machine_for(do(key, tier="1g")).name == "s-2vcpu-4gb"
    assert catalog.machine_for(do(key, tier="10g")).name == "s-2vcpu-4gb-amd"
    # Burst ratings never qualify: m5.large says "Up to 10 Gigabit" but sustains 0.75.
    assert "m5.large" not in {t.name for t in catalog.load_catalog("aws").qualifying(1)}


def test_a_type_below_the_tier_is_refused_naming_one_that_qualifies(key):
    with pytest.raises(ConfigError) as refused:
        catalog.machine_for(aws(key, instance_type="c5.large"))
    message = str(refused.value)
    assert "clusters.east.instance_type: c5.large has 0.75 Gbit/s baseline, bursts to 10 on credits" in message
    assert "below tier 10g" in message and "c7gn.xlarge qualifies" in message
    with pytest.raises(ConfigError, match="size: s-2vcpu-4gb has 2 Gbit/s documented limit.*s-2vcpu-4gb-amd qualifies"):
        catalog.machine_for(do(key, tier="10g", size="s-2vcpu-4gb"))
    with pytest.raises(ConfigError, match="no digitalocean type .* reaches tier 25g"):
        catalog.machine_for(do(key, tier="25g"))
    with pytest.raises(ConfigError, match="x1.huge is not in the aws catalog.*fatpipe catalog aws --region us-east-1"):
        catalog.machine_for(aws(key, instance_type="x1.huge"))
    with pytest.raises(ConfigError, match="has 0 GPU"):
        catalog.machine_for(aws(key, instance_type="c5n.2xlarge", gpus_per_node=1))
    assert catalog.machine_for(aws(key, instance_type="c5n.2xlarge")).name == "c5n.2xlarge"


def test_estimate_prices_the_whole_cluster(key):
    est = catalog.estimate(aws(key, nodes=4))
    assert (est.machine, est.baseline_gbps) == ("c7gn.xlarge", 12.5)
    # The machine, its public IPv4 address and detailed monitoring, for each node.
    assert est.hourly == pytest.approx(4 * (0.2496 + 0.005 + 0.00288))
    assert est.extras == ("public IPv4 address", "detailed monitoring")
    assert "us-east-1" in est.prices and "2025" in est.prices


def test_type_records_judge_on_the_default_card_and_fixed_ratings():
    info = {"InstanceType": "x.big", "VCpuInfo": {"DefaultVCpus": 8}, "MemoryInfo": {"SizeInMiB": 16384},
            "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
            "NetworkInfo": {"NetworkPerformance": "Up to 25 Gigabit", "DefaultNetworkCardIndex": 0,
                            "NetworkCards": [{"NetworkCardIndex": 0, "BaselineBandwidthInGbps": 10.0,
                                              "PeakBandwidthInGbps": 25.0}]}}
    assert aws_api.aws_type_record(info)["baseline_gbps"] == 10.0
    info["NetworkInfo"] = {"NetworkPerformance": "25 Gigabit"}
    assert aws_api.aws_type_record(info)["baseline_gbps"] == 25.0
    info["NetworkInfo"] = {"NetworkPerformance": "Up to 10 Gigabit"}
    assert aws_api.aws_type_record(info)["baseline_gbps"] is None


# -- refresh from EC2 (moto) ----------------------------------------------------------------

def test_refresh_writes_the_region_catalog_which_then_takes_precedence(mocked, tmp_path, key):
    path, _ = aws_api.refresh_aws_catalog("af-south-1", tmp_path)
    assert path == tmp_path / ".fatpipe" / "catalog" / "aws-af-south-1.json"
    data = json.loads(path.read_text())
    assert data["region"] == "af-south-1" and len(data["types"]) > 100
    assert data["types"]["c5n.2xlarge"]["baseline_gbps"] == 10.0
    assert "c7gn.xlarge" not in data["types"]  # not offered in af-south-1
    found = catalog.load_catalog("aws", "af-south-1", tmp_path)
    assert found.path == path and found.region == "af-south-1"
    cluster = aws(key, region="af-south-1", tier="10g")
    picked = catalog.machine_for(cluster, tmp_path)
    assert picked.name in data["types"] and picked.baseline_gbps >= 10 and picked.price_hourly
    assert catalog.load_catalog("aws", "us-east-1", tmp_path).path == catalog.offline_path("aws")


def test_catalog_command_refreshes_aws(mocked, run_cli, project_dir):
    result = run_cli("catalog", "aws", "--region", "af-south-1")
    assert result.exit_code == 0, result.output
    assert (project_dir / ".fatpipe" / "catalog" / "aws-af-south-1.json").is_file()
    assert "refreshed" in result.output and "af-south-1" in result.output and "10g" in result.output
    table = result.output.split("aws catalog ")[1]  # after the changes, which name c7gn as removed
    assert "c7gn" not in table  # the table now knows what af-south-1 offers


def test_catalog_command_offline_and_without_credentials(run_cli, monkeypatch, tmp_path):
    result = run_cli("catalog", "digitalocean")
    assert result.exit_code == 0 and "s-2vcpu-4gb-amd" in result.output and "(none)" in result.output
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = run_cli("catalog", "aws", "--region", "us-east-1")
    assert result.exit_code == 1 and "no AWS credentials found" in result.output


# -- preflight (moto) ---------------------------------------------------------------------------

def test_preflight_passes_for_a_qualifying_offered_type(mocked, key):
    from fatpipe.stacks.providers.aws_api import preflight

    preflight(aws(key))
    preflight(aws(key, instance_type="c5n.2xlarge", region="eu-west-1"))


def test_preflight_refuses_a_type_below_the_tier_by_the_live_data(mocked, key):
    from fatpipe.stacks.providers.aws_api import preflight

    # Not in the offline catalog, so only the live API can judge it.
    with pytest.raises(FatpipeError) as refused:
        preflight(aws(key, instance_type="m5a.large"))
    message = str(refused.value)
    assert "\n" not in message
    assert "m5a.large has a baseline of" in message and "below tier 10g" in message
    assert "c7gn.xlarge qualifies" in message


def test_preflight_refuses_a_type_not_offered_there(mocked, key):
    from fatpipe.stacks.providers.aws_api import preflight

    with pytest.raises(FatpipeError) as refused:
        preflight(aws(key, region="af-south-1"))  # the automatic pick, c7gn.xlarge, is not there
    message = str(refused.value)
    assert message.startswith("c7gn.xlarge is not offered in af-south-1;")
    assert "and is offered there" in message and "fatpipe catalog aws --region af-south-1" in message
    with pytest.raises(FatpipeError, match="not offered in us-east-1e"):
        preflight(aws(key, instance_type="c7gn.xlarge", availability_zone="us-east-1e"))


def test_preflight_without_credentials_says_so(aws_env, monkeypatch, tmp_path, key):
    from fatpipe.stacks.providers.aws_api import preflight

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(FatpipeError, match="^no AWS credentials found"):
        preflight(aws(key))
