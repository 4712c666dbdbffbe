"""An AWS cluster across regions: the cluster file's keys, where each node is and its address, and
the synthesized stack (a VPC per region, every pair peered both ways, security groups that admit
exactly the peers' ranges, one `cluster` output); a cluster of one region keeps today's stack."""

from __future__ import annotations

import ipaddress
import json
from itertools import combinations

import pytest

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.project import Project, parse_project

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyForSynthesisOnly t@t"
REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]
THREE = f'regions = {json.dumps(REGIONS)}\nnodes = 5\ntier = "10g"\nmax_rtt_ms = 150'
SSH_CIDR = "198.51.100.7/32"


def project(tmp_path, extra: str) -> Project:
    key = tmp_path / "id.pub"
    key.write_text(PUBLIC_KEY + "\n")
    text = f'[clusters.m]\nprovider = "aws"\nssh_public_key = "{key}"\nssh_cidr = "{SSH_CIDR}"\n{extra}\n'
    return Project(parse_project(text, "fatpipe.toml"), tmp_path, tmp_path / "fatpipe.toml")


# -- the cluster file ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,message", [
    ('regions = ["us-east-1", "us-west-9"]', "clusters.m.regions: 'us-west-9' is not an AWS region"),
    ('regions = ["us-east-1", "us-west-2", "us-east-1"]', "clusters.m.regions: us-east-1 is named twice"),
    ('regions = ["us-east-1", "us-west-2", "eu-west-1"]\nnodes = 2',
     "clusters.m: regions: 3 regions but 2 nodes; every region needs a node"),
    ('region = "us-west-2"\nregions = ["us-east-1", "us-west-2"]',
     "clusters.m: region us-west-2 is not the first of regions (us-east-1)"),
    ('regions = ["us-east-1", "us-west-2"]\navailability_zone = "us-east-1a"',
     "clusters.m: availability_zone: a zone is in one region"),
    ('regions = ["us-east-1", "us-west-2", "eu-west-1"]\nprivate_cidr = "10.1.0.0/27"',
     "clusters.m: private_cidr 10.1.0.0/27 split over 3 regions gives each a /29, and an AWS VPC is /28 at least"),
    ('regions = ["us-east-1", "us-west-2"]\nnodes = 50\nprivate_cidr = "10.1.0.0/26"',
     "clusters.m: private_cidr 10.1.0.0/26 split over 2 regions holds at most 21 nodes a region"),
    ('regions = "us-east-1"', "clusters.m: regions: a list of AWS regions, the home region first"),
    ('regions = []', "clusters.m: regions: a list of AWS regions"),
    ('region = "us-east-1"\nregions = []', "clusters.m.regions: List should have at least 1 item"),
])
def test_a_bad_regions_layout_is_one_line_naming_the_key(tmp_path, extra, message):
    with pytest.raises(ConfigError) as e:
        project(tmp_path, extra)
    problems = [line for line in str(e.value).splitlines() if "clusters.m" in line]
    assert len(problems) == 1 and message in problems[0], str(e.value)


def test_regions_split_the_nodes_and_private_cidr_in_order(tmp_path):
    from fatpipe.infra.vmspec import VmCluster

    c = project(tmp_path, THREE + '\nprivate_cidr = "10.70.0.0/22"').clusters["m"]
    assert c.region == "us-east-1" and c.node_regions == REGIONS and c.spans_regions
    # The fewest equal parts of private_cidr that give each region one (3 regions: 4 parts).
    assert c.region_cidrs == ["10.70.0.0/24", "10.70.1.0/24", "10.70.2.0/24"]
    assert [c.node_region(i) for i in range(5)] == ["us-east-1", "us-east-1", "us-west-2", "us-west-2", "eu-west-1"]
    # .10 up in each region's range: node 0 (the rendezvous host) at the first region's .10.
    assert [c.private_ip(i) for i in range(5)] == ["10.70.0.10", "10.70.0.11", "10.70.1.10", "10.70.1.11", "10.70.2.10"]
    # The vm provider's rule (consecutive groups), for every layout up to 24 nodes.
    for nodes in range(1, 25):
        for count in range(1, nodes + 1):
            vm = VmCluster(provider="vm", name="v", nodes=nodes, regions=count, cross_region_rtt_ms=None if count == 1 else 1)
            aws = c.model_copy(update={"nodes": nodes, "regions": [f"r{r}" for r in range(count)], "region": "r0"})
            assert [aws.region_index(i) for i in range(nodes)] == [vm.region_of(i) for i in range(nodes)]
            assert [i for r in range(count) for i in aws.region_nodes(r)] == list(range(nodes))
            ips = [aws.private_ip(i) for i in range(nodes)]
            assert len(set(ips)) == nodes and all(
                ipaddress.ip_address(ip) in ipaddress.ip_network(aws.region_cidrs[aws.region_index(i)])
                for i, ip in enumerate(ips))


def test_one_region_named_either_way_is_todays_cluster(tmp_path):
    listed = project(tmp_path, 'regions = ["eu-west-1"]').clusters["m"]
    plain = project(tmp_path, 'region = "eu-west-1"').clusters["m"]
    assert listed.region == plain.region == "eu-west-1" and not listed.spans_regions
    assert listed.region_cidrs == [plain.private_cidr]
    assert [listed.private_ip(i) for i in range(4)] == [plain.private_ip(i) for i in range(4)] == \
        [f"10.42.0.{10 + i}" for i in range(4)]


def test_synth_warns_of_a_round_trip_left_at_the_default_and_the_cross_region_cap(tmp_path):
    from fatpipe.stacks.providers import provider_for

    aws = provider_for("aws")
    warned = aws.warnings(project(tmp_path, THREE.replace("max_rtt_ms = 150", "")).clusters["m"])
    assert any("max_rtt_ms is not set" in w for w in warned)
    assert any("between regions AWS carries a node's traffic at 5 Gbit/s" in w for w in warned)
    assert aws.warnings(project(tmp_path, THREE.replace('"10g"', '"1g"')).clusters["m"]) == []


def test_the_console_of_a_node_is_read_in_its_own_region(monkeypatch):
    import fatpipe.stacks.providers.aws_api as aws_api
    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.stacks.providers import provider_for

    asked = []
    monkeypatch.setattr(aws_api, "console_output", lambda region, instance: asked.append((region, instance)))
    nodes = [{"name": f"m-{i}", "public_ip": f"54.1.2.{i}", "private_ip": f"10.42.0.{10 + i}", "transport": "ssh",
              "instance_id": f"i-{i}", **region} for i, region in enumerate([{}, {"region": "eu-west-1"}])]
    outputs = parse_outputs({"name": "m", "provider": "aws", "region": "us-east-1", "tier_gbps": 1,
                             "private_cidr": "10.42.0.0/24", "nodes": nodes})
    for node in outputs.nodes:
        provider_for("aws").console_output(outputs, node)
    assert asked == [("us-east-1", "i-0"), ("eu-west-1", "i-1")]


def test_preflight_asks_every_region_for_the_type(tmp_path, monkeypatch):
    """moto: AWS's own offerings per region (c7gn.xlarge, the 10g pick, is not in af-south-1)."""
    from moto import mock_aws

    from fatpipe.infra.errors import FatpipeError
    from fatpipe.stacks.providers.aws_api import preflight

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        preflight(project(tmp_path, 'regions = ["us-east-1", "eu-west-1"]\ntier = "10g"').clusters["m"])
        with pytest.raises(FatpipeError) as refused:
            preflight(project(tmp_path, 'regions = ["us-east-1", "af-south-1"]\ntier = "10g"').clusters["m"])
    assert str(refused.value).startswith("c7gn.xlarge is not offered in af-south-1;")
    assert "fatpipe catalog aws --region af-south-1" in str(refused.value) and "\n" not in str(refused.value)


# -- the synthesized stack -------------------------------------------------------------------------

def synth(p: Project) -> dict:
    from fatpipe.stacks.app import build_stack
    from fatpipe.stacks.toolkit import Testing

    return json.loads(Testing.synth(build_stack(Testing.app(), p.clusters["m"], p)))


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> tuple[dict, object]:
    """The stack of 5 nodes in 3 regions, synthesized once, and its cluster."""
    p = project(tmp_path_factory.mktemp("regions"), THREE)
    return synth(p), p.clusters["m"]


def slug(region: str) -> str:
    return region.replace("-", "_")


def test_one_provider_alias_per_region_and_every_resource_names_its_own(three):
    doc, cluster = three
    providers = doc["provider"]["aws"]
    assert [(p["alias"], p["region"]) for p in providers] == [(slug(r), r) for r in REGIONS]
    assert {p["default_tags"][0]["tags"]["fatpipe:cluster"] for p in providers} == {"m"}
    for block in ("resource", "data"):
        for rtype, items in doc[block].items():
            for name, item in items.items():
                if rtype in ("aws_vpc_peering_connection", "aws_vpc_peering_connection_accepter"):
                    continue  # below: they name the requester's and the accepter's region
                (region,) = [r for r in REGIONS if name.startswith(f"{slug(r)}_")]
                assert item["provider"] == f"aws.{slug(region)}", name
    for region, cidr in zip(REGIONS, cluster.region_cidrs, strict=True):
        s = slug(region)
        assert doc["resource"]["aws_vpc"][f"{s}_vpc"]["cidr_block"] == cidr
        assert doc["resource"]["aws_subnet"][f"{s}_subnet"]["cidr_block"] == cidr
        assert doc["resource"]["aws_placement_group"][f"{s}_placement"]["strategy"] == "cluster"
        assert doc["resource"]["aws_key_pair"][f"{s}_key"]["public_key"] == PUBLIC_KEY
        assert f"{s}_ami" in doc["data"]["aws_ssm_parameter"] and f"{s}_zones" in doc["data"]["aws_ec2_instance_type_offerings"]
        # The VPC's default group emptied in every region.
        assert doc["resource"]["aws_default_security_group"][f"{s}_default_sg"]["vpc_id"] == f"${{aws_vpc.{s}_vpc.id}}"


def test_every_pair_of_regions_is_peered_accepted_and_routed_both_ways(three):
    doc, cluster = three
    cidr = dict(zip(REGIONS, cluster.region_cidrs, strict=True))
    resource = doc["resource"]
    pairs = list(combinations(REGIONS, 2))
    assert len(resource["aws_vpc_peering_connection"]) == len(resource["aws_vpc_peering_connection_accepter"]) == 3
    for a, b in pairs:
        request = resource["aws_vpc_peering_connection"][f"peering_{slug(a)}_{slug(b)}"]
        assert request["provider"] == f"aws.{slug(a)}" and request["peer_region"] == b
        assert request["vpc_id"] == f"${{aws_vpc.{slug(a)}_vpc.id}}"
        assert request["peer_vpc_id"] == f"${{aws_vpc.{slug(b)}_vpc.id}}"
        assert "auto_accept" not in request  # across regions only the peer's side may accept
        accepter = resource["aws_vpc_peering_connection_accepter"][f"accept_{slug(a)}_{slug(b)}"]
        assert accepter["provider"] == f"aws.{slug(b)}" and accepter["auto_accept"] is True
        assert accepter["vpc_peering_connection_id"] == f"${{aws_vpc_peering_connection.peering_{slug(a)}_{slug(b)}.id}}"
        for here, there in ((a, b), (b, a)):
            route = resource["aws_route"][f"{slug(here)}_to_{slug(there)}"]
            assert route["provider"] == f"aws.{slug(here)}"
            assert route["route_table_id"] == f"${{aws_route_table.{slug(here)}_routes.id}}"
            assert route["destination_cidr_block"] == cidr[there]
            # Through the accepter: no route before the connection is active.
            assert route["vpc_peering_connection_id"] == f"${{aws_vpc_peering_connection_accepter.accept_{slug(a)}_{slug(b)}.id}}"
    # Each route table: the internet and exactly the other regions' ranges.
    for region in REGIONS:
        dests = sorted(r["destination_cidr_block"] for r in resource["aws_route"].values()
                       if r["route_table_id"] == f"${{aws_route_table.{slug(region)}_routes.id}}")
        assert dests == sorted(["0.0.0.0/0", *(cidr[r] for r in REGIONS if r != region)])


@pytest.mark.parametrize("kind", ["ingress", "egress"])
def test_each_regions_group_admits_its_members_and_exactly_each_peers_range(three, kind):
    doc, cluster = three
    cidr = dict(zip(REGIONS, cluster.region_cidrs, strict=True))
    rules = doc["resource"][f"aws_vpc_security_group_{kind}_rule"]
    for region in REGIONS:
        group = f"${{aws_security_group.{slug(region)}_members.id}}"
        own = {name: r for name, r in rules.items() if r["security_group_id"] == group}
        assert all(name.startswith(f"{slug(region)}_") and r["provider"] == f"aws.{slug(region)}" for name, r in own.items())
        everything = [r for r in own.values() if r["ip_protocol"] == "-1"]
        # All traffic: from its own members by the group itself, and from each peer's VPC range,
        # exactly (a group cannot name another region's group), and from nowhere else.
        assert sorted(r.get("cidr_ipv4") or r["referenced_security_group_id"] for r in everything) == sorted(
            [group, *(cidr[r] for r in REGIONS if r != region)])
        by_cidr = {r.get("cidr_ipv4") or r.get("cidr_ipv6") for r in own.values()} - {None}
        if kind == "ingress":
            # SSH from ssh_cidr alone; the internet only for ICMP fragmentation-needed, as in one region.
            ssh = [r for r in own.values() if r.get("from_port") == 22]
            assert ssh == [own[f"{slug(region)}_in_ssh"]] and ssh[0]["cidr_ipv4"] == SSH_CIDR
            assert [r for r in own.values() if r.get("cidr_ipv4") == "0.0.0.0/0"] == [own[f"{slug(region)}_in_pmtud"]]
            assert by_cidr == {SSH_CIDR, "0.0.0.0/0", *(cidr[r] for r in REGIONS if r != region)}
        else:
            world = {(r["ip_protocol"], r["from_port"]) for r in own.values() if r.get("cidr_ipv4") == "0.0.0.0/0"}
            assert world == {("tcp", 443), ("tcp", 80)}


def test_each_regions_nodes_are_its_own_instances_imdsv2_encrypted_on_its_network(three):
    doc, cluster = three
    instances = doc["resource"]["aws_instance"]
    assert sorted(instances) == sorted(f"{slug(r)}_nodes" for r in REGIONS)
    for position, region in enumerate(REGIONS):
        s = slug(region)
        node = instances[f"{s}_nodes"]
        assert node["for_each"] == {cluster.node_name(i): cluster.private_ip(i) for i in cluster.region_nodes(position)}
        assert (node["subnet_id"], node["key_name"], node["vpc_security_group_ids"], node["placement_group"]) == (
            f"${{aws_subnet.{s}_subnet.id}}", f"${{aws_key_pair.{s}_key.key_name}}",
            [f"${{aws_security_group.{s}_members.id}}"], f"${{aws_placement_group.{s}_placement.name}}")
        assert node["ami"] == f"${{data.aws_ssm_parameter.{s}_ami.insecure_value}}"
        assert node["metadata_options"]["http_tokens"] == "required" and node["root_block_device"]["encrypted"] is True
        assert node["user_data"] == "${local.user_data}" and node["user_data_replace_on_change"] is True
        # It boots after its own region's routes and rules (apt at first boot), the peers' included.
        rules = {f"{kind}.{name}" for kind in ("aws_vpc_security_group_ingress_rule", "aws_vpc_security_group_egress_rule")
                 for name in doc["resource"][kind] if name.startswith(f"{s}_")}
        assert set(node["depends_on"]) == {f"aws_route.{s}_internet", f"aws_route_table_association.{s}_subnet_routes", *rules}
    # One user data for every region, without keys or secrets.
    text = doc["locals"]["user_data"]
    for secret in ("PRIVATE KEY", "aws_secret_access_key", "AKIA"):
        assert secret not in text


def test_one_cluster_output_holds_every_regions_nodes(three):
    from fatpipe.infra.outputs import parse_outputs

    doc, cluster = three
    assert list(doc["output"]) == ["cluster"]
    value = doc["output"]["cluster"]["value"]
    assert value["region"] == "us-east-1" and value["private_cidr"] == cluster.private_cidr == "10.42.0.0/24"
    assert value["max_rtt_ms"] == 150
    for i, node in enumerate(value["nodes"]):
        s = slug(cluster.node_region(i))
        assert node["region"] == cluster.node_region(i) and node["private_ip"] == cluster.private_ip(i)
        assert node["public_ip"] == f'${{aws_instance.{s}_nodes["m-{i}"].public_ip}}'
        assert node["instance_id"] == f'${{aws_instance.{s}_nodes["m-{i}"].id}}'
    # As deploy reads it back (the references resolved): one cluster, node 0 the rendezvous host.
    resolved = {**value, "nodes": [{**node, "public_ip": f"54.0.0.{i}", "instance_id": f"i-{i}"}
                                   for i, node in enumerate(value["nodes"])]}
    outputs = parse_outputs({"m": {"cluster": resolved}})
    assert [n.region for n in outputs.nodes] == ["us-east-1", "us-east-1", "us-west-2", "us-west-2", "eu-west-1"]
    assert outputs.rdzv_endpoint == "10.42.0.10:29400"


def test_up_redeploys_a_cluster_whose_regions_changed(three, tmp_path):
    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.ops.reach.deployment import deployment_mismatch

    doc, cluster = three
    value = doc["output"]["cluster"]["value"]
    outputs = parse_outputs({**value, "nodes": [{**n, "public_ip": "54.0.0.1", "instance_id": "i-1"}
                                                for n in value["nodes"]]})
    assert deployment_mismatch(outputs, cluster) is None
    moved = cluster.model_copy(update={"regions": ["us-east-1", "us-west-2", "ap-south-1"]})
    assert "regions is ['us-east-1', 'us-east-1', 'us-west-2', 'us-west-2', 'eu-west-1'] in the outputs" \
        in deployment_mismatch(outputs, moved)
    one = project(tmp_path, 'region = "us-east-1"\nnodes = 5\ntier = "10g"\nmax_rtt_ms = 150').clusters["m"]
    assert "but [None, None, None, None, None] in the cluster file" in deployment_mismatch(outputs, one)


def test_one_region_keeps_todays_names_and_one_unaliased_provider(tmp_path):
    """What a deployed cluster's state holds: another address would replace its resources."""
    doc = synth(project(tmp_path, 'region = "us-east-1"\nnodes = 2'))
    assert synth(project(tmp_path, 'regions = ["us-east-1"]\nnodes = 2')) == doc
    assert [set(p) for p in doc["provider"]["aws"]] == [{"region", "default_tags"}]
    addresses = {f"{kind}.{name}" for kind, items in doc["resource"].items() for name in items}
    assert addresses == {
        "aws_vpc.vpc", "aws_default_security_group.default_sg", "aws_subnet.subnet", "aws_internet_gateway.igw",
        "aws_route_table.routes", "aws_route.internet", "aws_route_table_association.subnet_routes",
        "aws_security_group.members", "aws_key_pair.key", "aws_placement_group.placement", "aws_instance.nodes",
        *(f"aws_vpc_security_group_ingress_rule.in_{n}" for n in ("ssh", "from_members", "pmtud")),
        *(f"aws_vpc_security_group_egress_rule.out_{n}" for n in ("to_members", "https", "http")),
    }
    assert not any("provider" in item for items in doc["resource"].values() for item in items.values())
    assert not any("region" in node for node in doc["output"]["cluster"]["value"]["nodes"])
    assert doc["resource"]["aws_vpc"]["vpc"]["tags"] == {"Name": "fatpipe-m"}
