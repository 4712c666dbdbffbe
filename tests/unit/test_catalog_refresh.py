"""`fatpipe catalog`: the AWS refresh against moto (DescribeInstanceTypes, per network card), the
DigitalOcean refresh against the fake sizes API, and what a refresh keeps and reports."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra import catalog
from fatpipe.infra.catalogdiff import changes
from fatpipe.infra.errors import ConfigError
from fatpipe.stacks.providers import aws_api
from fatpipe.stacks.providers.digitalocean_sizes import refresh_digitalocean_catalog

from .test_catalog import aws_env, mocked  # noqa: F401  (fixtures)
from .test_digitalocean_api import TOKEN, do_api  # noqa: F401  (the fake DigitalOcean API)


def test_moto_reports_baseline_and_peak_per_network_card(mocked, tmp_path):  # noqa: F811
    path, changed = aws_api.refresh_aws_catalog("us-east-1", tmp_path, families=("c5n", "p5", "t3"))
    data = json.loads(path.read_text())
    types = data["types"]
    assert {n.split(".")[0] for n in types} == {"c5n", "p5", "t3"}
    # moto 5's snapshot of the real API carries the per-card figures: burst-only c5n.large...
    assert (types["c5n.large"]["baseline_gbps"], types["c5n.large"]["peak_gbps"]) == (3.0, 25.0)
    assert types["c5n.large"]["network_cards"] == [{"index": 0, "baseline_gbps": 3.0, "peak_gbps": 25.0}]
    # ... and a type with many cards keeps each one; its baseline is the default card's.
    p5 = types["p5.48xlarge"]
    assert len(p5["network_cards"]) == 32 and p5["baseline_gbps"] == 100.0
    assert all(card["baseline_gbps"] == 100.0 for card in p5["network_cards"])
    assert types["c5n.large"]["ena"] == "required"
    assert types["t3.micro"]["cluster_placement"] is False and types["c5n.large"]["cluster_placement"] is True
    # Prices are the offline table's, with its source and date; p5 has none there: kept, unpriced.
    assert data["prices"]["date"] == "2025-06" and "price list" in data["prices"]["source"]
    assert types["p5.48xlarge"]["unpriced"] is True and types["c5n.large"]["unpriced"] is False
    found = catalog.load_catalog("aws", "us-east-1", tmp_path)
    assert found.types["p5.48xlarge"].price_hourly is None and found.types["c5n.large"].price_hourly == 0.108
    # Against the offline catalog (its families) the others are gone; the figures did not move.
    assert changed[:2] == ["added 1: c5n.metal", changed[1]] and changed[1].startswith("removed ")
    assert not [line for line in changed if "_gbps" in line]


def test_the_refresh_keeps_each_type_s_gpu_kind_from_gpuinfo(mocked, tmp_path):  # noqa: F811
    families = ("g4dn", "g6e", "g6f", "p3dn", "p4d", "p4de", "c5n")
    path, _ = aws_api.refresh_aws_catalog("us-east-1", tmp_path, families=families)
    types = json.loads(path.read_text())["types"]
    g4dn = types["g4dn.12xlarge"]  # GpuInfo: 4 x NVIDIA T4, 16 GiB each
    assert (g4dn["gpus"], g4dn["gpu_kind"], g4dn["gpu_name"], g4dn["gpu_memory_gib"]) == (4, "t4", "NVIDIA T4", 16.0)
    assert types["g6e.xlarge"]["gpu_kind"] == "l40s" and types["p3dn.24xlarge"]["gpu_kind"] == "v100"
    # EC2 names both A100s "A100": their memory tells them apart.
    assert (types["p4d.24xlarge"]["gpu_kind"], types["p4de.24xlarge"]["gpu_kind"]) == ("a100", "a100-80gb")
    # A share of one L4 (g6f): no whole GPU, its kind and share kept.
    assert types["g6f.large"]["gpus"] == 0 and types["g6f.large"]["gpu_kind"] == "l4"
    assert types["g6f.large"]["gpu_fraction"] == 0.125
    assert "gpu_kind" not in types["c5n.large"] and types["c5n.large"]["gpus"] == 0
    found = catalog.load_catalog("aws", "us-east-1", tmp_path).types
    assert (found["g4dn.12xlarge"].gpu_kind, found["g4dn.12xlarge"].gpus) == ("t4", 4)
    # A changed kind is reported; a catalog that had none (written before kinds) reports none.
    doc = json.loads(path.read_text())
    doc["types"]["g4dn.xlarge"]["gpu_kind"] = "a10g"
    del doc["types"]["g4dn.2xlarge"]["gpu_kind"]
    path.write_text(json.dumps(doc))
    catalog.clear_cache()
    _, changed = aws_api.refresh_aws_catalog("us-east-1", tmp_path, families=families)
    assert changed == ["g4dn.xlarge: gpu_kind a10g -> t4"]


def test_a_second_refresh_reports_only_what_changed(mocked, tmp_path):  # noqa: F811
    path, _ = aws_api.refresh_aws_catalog("us-east-1", tmp_path, types=("c5n.large", "c5n.xlarge"))
    doc = json.loads(path.read_text())
    doc["types"]["c5n.large"]["baseline_gbps"] = 5.0  # as if EC2 had changed its figure since
    path.write_text(json.dumps(doc))
    catalog.clear_cache()
    _, changed = aws_api.refresh_aws_catalog("us-east-1", tmp_path, types=("c5n.large", "c5n.xlarge"))
    assert changed == ["c5n.large: baseline_gbps 5 Gbit/s -> 3 Gbit/s"]
    assert not list(path.parent.glob(".*.tmp"))  # written by rename, no temporary left


def test_a_wanted_type_or_family_not_offered_is_refused_and_nothing_written(mocked, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match="--types: c5n.huge not offered there"):
        aws_api.refresh_aws_catalog("us-east-1", tmp_path, types=("c5n.large", "c5n.huge"))
    with pytest.raises(ConfigError, match="--families: no type of c7gn offered there"):
        aws_api.refresh_aws_catalog("af-south-1", tmp_path, families=("c7gn",))
    assert not (tmp_path / ".fatpipe").exists()


def test_the_rating_text_is_parsed_where_a_card_has_no_figures():
    assert aws_api.rating_gbps("25 Gigabit") == (25.0, 25.0)
    assert aws_api.rating_gbps("Up to 10 Gigabit") == (None, 10.0)
    assert aws_api.rating_gbps("Moderate") == (None, None)
    info = {"NetworkInfo": {"NetworkPerformance": "Up to 12.5 Gigabit", "DefaultNetworkCardIndex": 0,
                            "NetworkCards": [{"NetworkCardIndex": 0, "NetworkPerformance": "Up to 12.5 Gigabit"}]}}
    record = aws_api.aws_type_record(info)
    assert (record["baseline_gbps"], record["peak_gbps"]) == (None, 12.5)
    info = {"NetworkInfo": {"NetworkPerformance": "50 Gigabit"}}  # no cards at all
    assert aws_api.aws_type_record(info)["network_cards"] == [{"index": 0, "baseline_gbps": 50.0, "peak_gbps": 50.0}]


def test_changes_name_added_removed_and_changed_fields():
    old = {"a.1": {"baseline_gbps": 1.0, "vcpus": 2}, "b.1": {"baseline_gbps": 2.0}}
    new = {"a.1": {"baseline_gbps": 1.0, "vcpus": 4}, "c.1": {"baseline_gbps": 3.0}}
    assert changes(old, new) == ["added 1: c.1", "removed 1: b.1", "a.1: vcpus 2 vCPU -> 4 vCPU"]
    assert changes(old, old) == []


def test_catalog_command_refreshes_aws_families_and_prints_changes(mocked, run_cli, project_dir):  # noqa: F811
    result = run_cli("catalog", "aws", "--region", "us-east-1", "--families", "c7gn,c6in")
    assert result.exit_code == 0, result.output
    assert "refreshed: .fatpipe/catalog/aws-us-east-1.json" in result.output and "removed" in result.output
    assert "c7gn.xlarge" in result.output
    result = run_cli("catalog", "aws", "--region", "us-east-1", "--types", "c7gn.nope")
    assert result.exit_code != 0 and "c7gn.nope not offered" in result.output
    assert json.loads((project_dir / ".fatpipe/catalog/aws-us-east-1.json").read_text())["types"]  # kept


# -- DigitalOcean: the sizes API ----------------------------------------------------------------

SIZES = [  # the fields of GET /v2/sizes that the catalog reads, as the API writes them
    {"slug": "s-2vcpu-4gb", "memory": 4096, "vcpus": 2, "price_hourly": 0.03571, "price_monthly": 24.0,
     "regions": ["nyc3", "fra1"], "available": True, "description": "Basic"},
    {"slug": "s-2vcpu-4gb-amd", "memory": 4096, "vcpus": 2, "price_hourly": 0.04167, "price_monthly": 28.0,
     "regions": ["nyc3"], "available": True, "description": "Premium AMD"},
    {"slug": "s-4vcpu-8gb-intel", "memory": 8192, "vcpus": 4, "price_hourly": 0.08333, "price_monthly": 56.0,
     "regions": ["nyc3", "fra1"], "available": True, "description": "Premium Intel"},
    {"slug": "c-4", "memory": 8192, "vcpus": 4, "price_hourly": 0.125, "price_monthly": 84.0,
     "regions": ["fra1"], "available": True, "description": "CPU-Optimized"},
    {"slug": "gpu-h100x1-80gb", "memory": 245760, "vcpus": 20, "price_hourly": 3.39, "price_monthly": 2521.0,
     "regions": ["nyc2"], "available": True, "description": "H100 GPU - 1X",
     "gpu_info": {"count": 1, "model": "nvidia_h100", "vram": {"amount": 80, "unit": "gib"}}},
    {"slug": "s-new-size", "memory": 2048, "vcpus": 1, "regions": ["nyc3"], "available": True,
     "description": "Basic"},  # no price given
    {"slug": "s-gone", "memory": 1024, "vcpus": 1, "price_hourly": 0.009, "regions": ["nyc3"],
     "available": False, "description": "Basic"},
]


def test_digitalocean_refresh_from_the_paged_sizes_api(do_api, tmp_path):  # noqa: F811
    do_api.data["sizes"] = SIZES
    path, changed = refresh_digitalocean_catalog(None, tmp_path)
    assert path == tmp_path / ".fatpipe" / "catalog" / "digitalocean.json"
    assert sum(p.startswith("/v2/sizes") for p, _ in do_api.seen) == 4  # 7 sizes, 2 a page
    data = json.loads(path.read_text())
    types = data["types"]
    assert set(types) == {"s-2vcpu-4gb", "s-2vcpu-4gb-amd", "s-4vcpu-8gb-intel", "c-4", "gpu-h100x1-80gb",
                          "s-new-size"}  # unavailable sizes are left out
    assert types["s-2vcpu-4gb"]["baseline_gbps"] == 2.0 and types["s-2vcpu-4gb-amd"]["baseline_gbps"] == 10.0
    assert types["s-4vcpu-8gb-intel"]["cpu"] == "premium" and types["c-4"]["baseline_gbps"] == 2.0
    assert types["gpu-h100x1-80gb"]["gpus"] == 1 and types["gpu-h100x1-80gb"]["memory_gib"] == 240.0
    assert (types["gpu-h100x1-80gb"]["gpu_kind"], types["gpu-h100x1-80gb"]["gpu_memory_gib"]) == ("h100", 80.0)
    assert "gpu_kind" not in types["c-4"]
    assert types["s-new-size"]["unpriced"] is True and "s-new-size" not in data["prices"]["hourly"]
    assert "/v2/sizes" in data["prices"]["source"] and data["prices"]["date"] == data["date"]
    assert TOKEN not in path.read_text()
    found = catalog.load_catalog("digitalocean", "nyc3", tmp_path)
    assert found.path == path and found.types["c-4"].price_hourly == 0.125
    assert found.types["s-2vcpu-4gb-amd"].bandwidth_basis == "documented limit"
    assert any(line.startswith("added 3:") for line in changed)  # against the offline catalog


def test_digitalocean_refresh_for_one_region_and_without_a_token(do_api, run_cli, project_dir, monkeypatch):  # noqa: F811
    do_api.data["sizes"] = SIZES
    result = run_cli("catalog", "digitalocean", "--region", "fra1")
    assert result.exit_code == 0, result.output
    data = json.loads((project_dir / ".fatpipe/catalog/digitalocean-fra1.json").read_text())
    assert set(data["types"]) == {"s-2vcpu-4gb", "s-4vcpu-8gb-intel", "c-4"} and data["region"] == "fra1"
    assert "refreshed" in result.output and "s-4vcpu-8gb-intel" in result.output  # 10g's cheapest in fra1
    assert TOKEN not in result.output
    do_api.failure = (401, json.dumps({"id": "unauthorized", "message": "Unable to authenticate you"}))
    result = run_cli("catalog", "digitalocean", "--region", "fra1")
    assert result.exit_code == 1 and "HTTP 401 Unable to authenticate you" in result.output
    monkeypatch.delenv("DIGITALOCEAN_TOKEN")
    result = run_cli("catalog", "digitalocean")  # no token: the catalog in use, no API call
    assert result.exit_code == 0 and "refreshed" not in result.output
    result = run_cli("catalog", "digitalocean", "--types", "c-4")
    assert result.exit_code == 2 and "set DIGITALOCEAN_TOKEN" in result.output


def test_a_digitalocean_gpu_size_is_known_by_its_gpu_info_else_its_slug():
    from fatpipe.stacks.providers.digitalocean_sizes import size_record

    by_info = size_record({"slug": "gpu-l40sx1-48gb", "vcpus": 8, "memory": 65536,
                           "gpu_info": {"count": 1, "model": "nvidia_l40s", "vram": {"amount": 48, "unit": "gib"}}})
    assert (by_info["gpus"], by_info["gpu_kind"], by_info["gpu_memory_gib"]) == (1, "l40s", 48.0)
    by_slug = size_record({"slug": "gpu-h100x8-640gb", "vcpus": 160, "memory": 1966080})
    assert (by_slug["gpus"], by_slug["gpu_kind"], by_slug["gpu_memory_gib"]) == (8, "h100", 80.0)
    assert size_record({"slug": "s-2vcpu-4gb", "vcpus": 2, "memory": 4096})["gpus"] == 0
