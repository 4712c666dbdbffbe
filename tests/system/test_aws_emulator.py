"""The AWS stack applied for real: `fatpipe deploy` and `fatpipe down` through terraform and the real
hashicorp/aws provider, against moto's server (an AWS API emulator) on 127.0.0.1; one cluster in
one region, one across three (moto serves every region from one endpoint).

The one-region cluster also shows that changing the project never replaces a node without asking
(real plans, real applies): a version bump, new requirements and another torch deploy with no change
to any instance; a machine type change (an in-place stop and start) is refused without `--replace`,
one line per node, the state untouched; `--replace` goes through, the same instances now of the new
type. (One cluster for both: each apply with the real provider costs minutes on a loaded machine. A
replace and a node made again after it is gone are read from real plans in
tests/system/test_deploy_replace.py's sim test and in tests/unit/test_node_plan.py.)

What moto does not implement is swapped out by an override file in these tests alone, and each
test asserts exactly what was swapped; everything else of the stack is created and destroyed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest

from .conftest import free_port, wait_for_port

CLUSTER = "emu"
NODES = 8
# What moto 5 cannot do, and its stand-in here (nowhere else):
SWAPPED = {
    # CreatePlacementGroup answers 500 and the provider retries until its timeout.
    "aws_placement_group.placement": {"count": 0},
    # MonitorInstances is not implemented (500, retried); the group is gone, see above.
    "aws_instance.nodes": {"monitoring": False, "placement_group": None},
    # Reserved /aws/service/... names cannot be seeded; moto ships Amazon Linux's.
    "data.aws_ssm_parameter.ami": {"name": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"},
}


def emulator_override(endpoint: str, aws_version: str, regions: list[str] | None = None) -> dict:
    """Point the provider (with `regions`: each region's alias, as the stack names it) at the
    emulator, pin the mirror's version, and make the swaps above (in every region)."""
    def provider(region: str, **alias) -> dict:
        return {**alias, "region": region, "access_key": "test", "secret_key": "test",
                "skip_credentials_validation": True, "skip_requesting_account_id": True,
                "skip_metadata_api_check": True, "skip_region_validation": True, "s3_use_path_style": True,
                "endpoints": {service: endpoint for service in ("ec2", "ssm", "sts", "iam", "s3")}}

    aliases = [region.replace("-", "_") for region in regions or []]
    doc: dict = {
        "terraform": {"required_providers": {"aws": {"source": "registry.terraform.io/hashicorp/aws",
                                                     "version": aws_version}}},
        "provider": {"aws": [provider(r, alias=a) for r, a in zip(regions, aliases, strict=True)] if regions
                     else provider("us-east-1")},
        "resource": {}, "data": {},
    }
    for prefix in [f"{alias}_" for alias in aliases] or [""]:
        for address, attributes in SWAPPED.items():
            *kind, rtype, name = address.split(".")
            doc["data" if kind else "resource"].setdefault(rtype, {})[prefix + name] = attributes
    return doc


# moto reads a member rule's group back as "<account>/sg-..." and without its description, so every
# plan after the first would modify the rule, which moto answers 400: ignored where a test plans
# again. (It reads no instance's security groups back either: each plan adds them again in place,
# an update that stops nothing, so it is applied without a question.)
MOTO_DRIFT = ("referenced_security_group_id", "description")
MEMBER_RULES = ("aws_vpc_security_group_ingress_rule.in_from_members",
                "aws_vpc_security_group_egress_rule.out_to_members")


@pytest.fixture
def moto_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if not wait_for_port(port, proc, timeout_s=60):
        proc.kill()
        pytest.fail(f"moto server did not start: {proc.communicate()[1]}")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def fatpipe(folder: Path, env: dict, *args: str, timeout: float = 900, stdin=None) -> subprocess.CompletedProcess:
    """`fatpipe ARGS`; with `stdin=subprocess.DEVNULL` no terminal answers: a question is a refusal."""
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, stdin=stdin,
                          capture_output=True, text=True, timeout=timeout)


def fatpipe_left(ec2, cluster: str = CLUSTER) -> dict[str, list[str]]:
    """What of fatpipe's (tagged by cluster, or named after it) still exists in the emulator."""
    tagged = [{"Name": "tag:fatpipe:cluster", "Values": [cluster]}]
    live = [i["InstanceId"] for r in ec2.describe_instances(Filters=tagged)["Reservations"]
            for i in r["Instances"] if i["State"]["Name"] != "terminated"]
    return {
        "vpcs": [v["VpcId"] for v in ec2.describe_vpcs(Filters=tagged)["Vpcs"]],
        "instances": live,
        "subnets": [s["SubnetId"] for s in ec2.describe_subnets(Filters=tagged)["Subnets"]],
        "security groups": [g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]
                            if g["GroupName"].startswith(f"fatpipe-{cluster}-")],
        "keys": [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]
                 if k["KeyName"].startswith(f"fatpipe-{cluster}-")],
    }


NOTHING_LEFT = {"vpcs": [], "instances": [], "subnets": [], "security groups": [], "keys": []}


def emulated_project(tmp_path: Path, cluster: str, table: str, override: dict, moto_server: str, aws_mirror,
                     monkeypatch) -> dict:
    """A project folder holding `[clusters.<cluster>]` (`table`, plus a fresh SSH key and ssh_cidr)
    and the emulator override beside its state; returns the environment fatpipe runs in."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "emu@fatpipe", "-f", str(tmp_path / "id")],
                   check=True)
    key = tmp_path / "id.pub"  # EC2 checks the key's format
    (tmp_path / "fatpipe.toml").write_text(f'[clusters.{cluster}]\nprovider = "aws"\n{table}'
                                           f'ssh_public_key = "{key}"\nssh_cidr = "203.0.113.7/32"\n')
    state_dir = tmp_path / ".fatpipe" / cluster
    state_dir.mkdir(parents=True)
    (state_dir / "emulator_override.tf.json").write_text(json.dumps(override, indent=1))
    # ssh must never leave this machine: the emulator's public IPs are made up.
    (tmp_path / "ssh_config").write_text("Host *\n  ProxyCommand /bin/false\n")
    credentials = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_server}
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    return {**os.environ, **aws_mirror.env, **credentials, "FATPIPE_SSH_CONFIG": str(tmp_path / "ssh_config")}


def state_addresses(folder: Path, cluster: str, env: dict) -> list[str]:
    return subprocess.run(["terraform", f"-chdir=cdktf.out/stacks/{cluster}", "state", "list"], cwd=folder,
                          env=env, capture_output=True, text=True, check=True).stdout.split()


def missing_resources(folder: Path, cluster: str, state: list[str]) -> set[str]:
    """Resources the synthesized stack declares that terraform did not create."""
    synthesized = json.loads((folder / "cdktf.out/stacks" / cluster / "cdk.tf.json").read_text())
    declared = {f"{t}.{n}" for t, rs in synthesized["resource"].items() for n in rs}
    return declared - {address.split("[")[0] for address in state if not address.startswith("data.")}


def instances(ec2, cluster: str = CLUSTER) -> dict[str, tuple[str, str]]:
    """{node name: (instance id, type)} of the cluster's live instances in the emulator."""
    tagged = [{"Name": "tag:fatpipe:cluster", "Values": [cluster]}]
    found = {}
    for reservation in ec2.describe_instances(Filters=tagged)["Reservations"]:
        for i in reservation["Instances"]:
            if i["State"]["Name"] != "terminated":
                name = next(t["Value"] for t in i["Tags"] if t["Key"] == "Name")
                found[name] = (i["InstanceId"], i["InstanceType"])
    return found


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # five terraform steps with the real provider, a stop and start of each node
def test_aws_stack_deploys_changes_only_when_asked_and_destroys_against_the_emulator(aws_mirror, moto_server,
                                                                                     tmp_path, monkeypatch):
    import boto3

    def table(instance_type: str) -> str:
        return f'region = "us-east-1"\nnodes = {NODES}\ntier = "10g"\ninstance_type = "{instance_type}"\n'

    override = emulator_override(moto_server, aws_mirror.version)
    for rule in MEMBER_RULES:
        rtype, name = rule.split(".")
        override["resource"].setdefault(rtype, {})[name] = {"lifecycle": {"ignore_changes": list(MOTO_DRIFT)}}
    env = emulated_project(tmp_path, CLUSTER, table("c5n.2xlarge"), override, moto_server, aws_mirror, monkeypatch)
    env["FATPIPE_TORCH"] = "torch==2.12.0"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "1.0.0"\n')
    (tmp_path / "requirements.txt").write_text("einops==0.7.0\n")
    state_dir = tmp_path / ".fatpipe" / CLUSTER
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_server)

    deploy = fatpipe(tmp_path, env, "deploy", "--engine", "terraform", "--yes", "-v")
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    assert "override files emulator_override.tf.json" in deploy.stderr
    outputs = json.loads((state_dir / "outputs.json").read_text())
    assert (outputs["name"], outputs["provider"], len(outputs["nodes"])) == (CLUSTER, "aws", NODES)
    assert [n["private_ip"] for n in outputs["nodes"]] == [f"10.42.0.{10 + i}" for i in range(NODES)]
    assert all(n["public_ip"] and n["transport"] == "ssh" for n in outputs["nodes"])
    assert outputs["nccl"] == {"NCCL_IB_DISABLE": "1"}

    # Exactly the swapped resources are missing from what terraform created.
    state = state_addresses(tmp_path, CLUSTER, env)
    assert missing_resources(tmp_path, CLUSTER, state) == {a for a, attrs in SWAPPED.items() if attrs.get("count") == 0}
    assert sum(a.startswith("aws_instance.nodes[") for a in state) == NODES
    left = fatpipe_left(ec2)
    assert len(left["instances"]) == NODES and len(left["vpcs"]) == 1 and len(left["keys"]) == 1
    made = instances(ec2)
    assert sorted(made) == [f"{CLUSTER}-{i}" for i in range(NODES)]

    status = fatpipe(tmp_path, env, "status", "--json", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    assert doc["deployed"] and [n["name"] for n in doc["nodes"]] == [f"{CLUSTER}-{i}" for i in range(NODES)]
    assert not any(n["ready"] for n in doc["nodes"])  # nothing boots in an emulator

    try:
        # What changes with the project: nothing of it is any node's.
        (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "1.0.1"\n')
        (tmp_path / "requirements.txt").write_text("einops==0.8.0\ntiktoken\n")
        bumped = fatpipe(tmp_path, {**env, "FATPIPE_TORCH": "torch==2.13.0"}, "deploy", "--engine", "terraform",
                         "--yes", "-v", stdin=subprocess.DEVNULL)
        assert bumped.returncode == 0, bumped.stdout + bumped.stderr
        assert re.search(r"Apply complete! Resources: 0 added, \d+ changed, 0 destroyed", bumped.stderr), \
            bumped.stderr[-3000:]
        assert "replace" not in bumped.stdout and "stop and start" not in bumped.stdout
        assert instances(ec2) == made

        # Another machine type: EC2 stops and starts each instance. Refused without --replace.
        toml = tmp_path / "fatpipe.toml"
        toml.write_text(toml.read_text().replace('"c5n.2xlarge"', '"c6in.2xlarge"'))
        before = digest(state_dir / "terraform.tfstate")
        refused = fatpipe(tmp_path, env, "deploy", "--engine", "terraform", "--yes", stdin=subprocess.DEVNULL)
        assert refused.returncode != 0
        lines = [line for line in refused.stdout.splitlines() if re.match(rf"{CLUSTER}-\d: ", line)]
        assert lines == [f"{CLUSTER}-{i}: stop and start (instance_type c5n.2xlarge -> c6in.2xlarge); holds: "
                         "unknown (no run or data push recorded here)" for i in range(NODES)], refused.stdout
        assert "nothing was changed" in refused.stderr and "--replace" in refused.stderr
        assert digest(state_dir / "terraform.tfstate") == before and instances(ec2) == made

        replaced = fatpipe(tmp_path, env, "deploy", "--engine", "terraform", "--yes", "--replace",
                           stdin=subprocess.DEVNULL)
        assert replaced.returncode == 0, replaced.stdout + replaced.stderr
        assert instances(ec2) == {name: (iid, "c6in.2xlarge") for name, (iid, _) in made.items()}
    finally:
        down = fatpipe(tmp_path, env, "down", "--engine", "terraform")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not (state_dir / "outputs.json").exists()
    assert fatpipe_left(ec2) == NOTHING_LEFT


REGIONS = ["us-east-1", "eu-west-1"]
SPREAD = "emu-regions"


@pytest.mark.slow
@pytest.mark.timeout(900)  # two providers in every terraform step: about 150 s idle, twice that loaded
def test_aws_stack_across_regions_deploys_and_destroys_against_the_emulator(aws_mirror, moto_server, tmp_path,
                                                                            monkeypatch):
    """3 nodes in 2 regions (2 + 1): a VPC each, peered, one `cluster` output, all destroyed. (Two
    regions, not three, to keep the test's time modest: each region's provider is a process of
    its own in every terraform step; tests/unit/test_aws_regions.py checks every pair of three.)

    What moto 5 models, and this test checks: a peering request names its peer VPC in the peer's
    region (a wrong `peer_region` would fail), waits in pending-acceptance, and only the peer's
    region may accept it (moto refuses an accept in the requester's region, as EC2 does); the
    accepter makes it active in both regions; the routes through it and the security group rules
    by CIDR are made and read back; a destroy deletes it. What moto does not model: it does not
    refuse peering VPCs whose ranges overlap (EC2 does: fatpipe's are disjoint by construction,
    tests/unit/test_aws_regions.py), nor a route to a connection not yet active (the stack's
    routes wait for the accepter anyway); and no packet crosses anything, so reachability between
    regions, AWS's encryption of inter-region peering, its 8500-byte MTU and its per-flow and
    egress caps are a real account's to show (netcheck measures the links). Placement groups,
    MonitorInstances and the /aws/service SSM names are swapped in every region, as above.
    """
    import boto3

    table = f'regions = {json.dumps(REGIONS)}\nnodes = 3\ntier = "1g"\nmax_rtt_ms = 150\n'
    override = emulator_override(moto_server, aws_mirror.version, REGIONS)
    env = emulated_project(tmp_path, SPREAD, table, override, moto_server, aws_mirror, monkeypatch)
    ec2 = {region: boto3.client("ec2", region_name=region, endpoint_url=moto_server) for region in REGIONS}

    deploy = fatpipe(tmp_path, env, "deploy", "--engine", "terraform", "--yes", "-v")
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    # One cluster: the home region's, every region's nodes, each in its region's part of 10.42.0.0/24.
    outputs = json.loads((tmp_path / ".fatpipe" / SPREAD / "outputs.json").read_text())
    assert (outputs["name"], outputs["region"], outputs["private_cidr"]) == (SPREAD, "us-east-1", "10.42.0.0/24")
    cidrs = {"us-east-1": "10.42.0.0/25", "eu-west-1": "10.42.0.128/25"}
    assert [(n["region"], n["private_ip"]) for n in outputs["nodes"]] == [
        ("us-east-1", "10.42.0.10"), ("us-east-1", "10.42.0.11"), ("eu-west-1", "10.42.0.138")]
    assert all(n["public_ip"] and n["instance_id"] for n in outputs["nodes"])

    state = state_addresses(tmp_path, SPREAD, env)
    assert missing_resources(tmp_path, SPREAD, state) == {f"aws_placement_group.{r.replace('-', '_')}_placement"
                                                          for r in REGIONS}
    for region in REGIONS:
        left = fatpipe_left(ec2[region], SPREAD)
        ids = {n["instance_id"] for n in outputs["nodes"] if n["region"] == region}
        assert set(left["instances"]) == ids and len(left["vpcs"]) == 1 and len(left["keys"]) == 1
        (vpc,) = ec2[region].describe_vpcs(VpcIds=left["vpcs"])["Vpcs"]
        assert vpc["CidrBlock"] == cidrs[region]

    peerings = {}
    for a, b in combinations(REGIONS, 2):
        (pcx,) = [p for p in ec2[a].describe_vpc_peering_connections()["VpcPeeringConnections"]
                  if p["AccepterVpcInfo"]["Region"] == b]
        assert (pcx["RequesterVpcInfo"]["Region"], pcx["RequesterVpcInfo"]["CidrBlock"]) == (a, cidrs[a])
        assert pcx["AccepterVpcInfo"]["CidrBlock"] == cidrs[b] and pcx["Status"]["Code"] == "active"
        peerings[a, b] = peerings[b, a] = pcx["VpcPeeringConnectionId"]
    tagged = [{"Name": "tag:fatpipe:cluster", "Values": [SPREAD]}]
    for region in REGIONS:
        (table_,) = ec2[region].describe_route_tables(Filters=tagged)["RouteTables"]
        via_peer = {r["DestinationCidrBlock"]: r["VpcPeeringConnectionId"] for r in table_["Routes"]
                    if r.get("VpcPeeringConnectionId")}
        assert via_peer == {cidrs[peer]: peerings[region, peer] for peer in REGIONS if peer != region}
        (group,) = [g for g in ec2[region].describe_security_groups()["SecurityGroups"]
                    if g["GroupName"].startswith(f"fatpipe-{SPREAD}-")]
        rules = ec2[region].describe_security_group_rules(
            Filters=[{"Name": "group-id", "Values": [group["GroupId"]]}])["SecurityGroupRules"]
        for egress in (False, True):
            everything = {r.get("CidrIpv4") for r in rules if r["IsEgress"] is egress and r["IpProtocol"] == "-1"} - {None}
            assert everything == {cidrs[peer] for peer in REGIONS if peer != region}

    status = fatpipe(tmp_path, env, "status", "--json", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert [n["name"] for n in json.loads(status.stdout)["nodes"]] == [f"{SPREAD}-{i}" for i in range(3)]

    down = fatpipe(tmp_path, env, "down", "--engine", "terraform")
    assert down.returncode == 0, down.stdout + down.stderr
    for region in REGIONS:
        assert fatpipe_left(ec2[region], SPREAD) == NOTHING_LEFT
        assert {p["Status"]["Code"] for p in ec2[region].describe_vpc_peering_connections()["VpcPeeringConnections"]} \
            == {"deleted"}
