"""The AWS stack applied for real: `fatpipe deploy` and `fatpipe down` through terraform and the real
hashicorp/aws provider, against moto's server (an AWS API emulator) on 127.0.0.1.

What moto does not implement is swapped out by an override file in this test alone, and the test
asserts exactly what was swapped; everything else of the stack is created and destroyed.
"""

from __future__ import annotations

import json
import subprocess
import sys
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


def emulator_override(endpoint: str, aws_version: str) -> dict:
    """Point the provider at the emulator, pin the mirror's version, and make the swaps above."""
    doc: dict = {
        "terraform": {"required_providers": {"aws": {"source": "registry.terraform.io/hashicorp/aws",
                                                     "version": aws_version}}},
        "provider": {"aws": {
            "region": "us-east-1", "access_key": "test", "secret_key": "test",
            "skip_credentials_validation": True, "skip_requesting_account_id": True,
            "skip_metadata_api_check": True, "skip_region_validation": True, "s3_use_path_style": True,
            "endpoints": {service: endpoint for service in ("ec2", "ssm", "sts", "iam", "s3")},
        }},
        "resource": {}, "data": {},
    }
    for address, attributes in SWAPPED.items():
        *kind, rtype, name = address.split(".")
        doc["data" if kind else "resource"].setdefault(rtype, {})[name] = attributes
    return doc


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


def fatpipe(folder: Path, env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc


def fatpipe_left(ec2) -> dict[str, list[str]]:
    """What of fatpipe's (tagged by cluster, or named after it) still exists in the emulator."""
    tagged = [{"Name": "tag:fatpipe:cluster", "Values": [CLUSTER]}]
    live = [i["InstanceId"] for r in ec2.describe_instances(Filters=tagged)["Reservations"]
            for i in r["Instances"] if i["State"]["Name"] != "terminated"]
    return {
        "vpcs": [v["VpcId"] for v in ec2.describe_vpcs(Filters=tagged)["Vpcs"]],
        "instances": live,
        "subnets": [s["SubnetId"] for s in ec2.describe_subnets(Filters=tagged)["Subnets"]],
        "security groups": [g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]
                            if g["GroupName"].startswith(f"fatpipe-{CLUSTER}-")],
        "keys": [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]
                 if k["KeyName"].startswith(f"fatpipe-{CLUSTER}-")],
    }


@pytest.mark.slow
def test_aws_stack_deploys_and_destroys_against_the_emulator(aws_mirror, moto_server, tmp_path, monkeypatch):
    import boto3

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "emu@fatpipe", "-f", str(tmp_path / "id")],
                   check=True)
    key = tmp_path / "id.pub"  # EC2 checks the key's format
    (tmp_path / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "aws"\nregion = "us-east-1"\nnodes = {NODES}\ntier = "10g"\n'
        f'ssh_public_key = "{key}"\nssh_cidr = "203.0.113.7/32"\n')
    state_dir = tmp_path / ".fatpipe" / CLUSTER
    state_dir.mkdir(parents=True)
    (state_dir / "emulator_override.tf.json").write_text(
        json.dumps(emulator_override(moto_server, aws_mirror.version), indent=1))
    # ssh must never leave this machine: the emulator's public IPs are made up.
    (tmp_path / "ssh_config").write_text("Host *\n  ProxyCommand /bin/false\n")
    credentials = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_server}
    env = {**__import__("os").environ, **aws_mirror.env, **credentials,
           "FATPIPE_SSH_CONFIG": str(tmp_path / "ssh_config")}
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
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
    synthesized = json.loads((tmp_path / "cdktf.out/stacks" / CLUSTER / "cdk.tf.json").read_text())
    declared = {f"{t}.{n}" for t, rs in synthesized["resource"].items() for n in rs}
    state = subprocess.run(["terraform", f"-chdir=cdktf.out/stacks/{CLUSTER}", "state", "list"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, check=True).stdout.split()
    created = {address.split("[")[0] for address in state if not address.startswith("data.")}
    assert declared - created == {a for a, attrs in SWAPPED.items() if attrs.get("count") == 0}
    assert sum(a.startswith("aws_instance.nodes[") for a in state) == NODES
    left = fatpipe_left(ec2)
    assert len(left["instances"]) == NODES and len(left["vpcs"]) == 1 and len(left["keys"]) == 1

    status = fatpipe(tmp_path, env, "status", "--json", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    assert doc["deployed"] and [n["name"] for n in doc["nodes"]] == [f"{CLUSTER}-{i}" for i in range(NODES)]
    assert not any(n["ready"] for n in doc["nodes"])  # nothing boots in an emulator

    down = fatpipe(tmp_path, env, "down", "--engine", "terraform")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not (state_dir / "outputs.json").exists()
    assert fatpipe_left(ec2) == {"vpcs": [], "instances": [], "subnets": [], "security groups": [], "keys": []}
