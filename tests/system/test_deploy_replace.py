"""Changing the project never replaces a node without asking: real plans, real applies.

AWS: terraform with the real hashicorp/aws provider against moto's server (the emulator override of
tests/system/test_aws_emulator.py). A version bump, new requirements and another torch deploy with
no change to any instance; a machine type change (an in-place stop and start) is refused without
`--replace`, one line per node, the state untouched; `--replace` goes through, the same instances
now of the new type. (Each apply with the real provider costs minutes on a loaded machine: a replace
and a node made again after it is gone are read from real plans in the sim test below and in
tests/unit/test_node_plan.py.) Sim (loopback, both engines): a tier change replaces each node and
fewer nodes destroy one, each refused without `--replace`; cdktf's deploy plans with terraform too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_or_fail

from .test_aws_emulator import emulator_override, moto_server  # noqa: F401 (the emulator fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CLUSTER = "dp-emu"
NODES = 2
# moto reads a member rule's group back as "<account>/sg-..." and without its description, so every
# plan after the first would modify the rule, which moto answers 400: ignored in this test alone.
# (It reads no instance's security groups back either: each plan adds them again in place, an
# update that stops nothing, so it is applied without a question.)
MOTO_DRIFT = ("referenced_security_group_id", "description")


def fatpipe(folder: Path, env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`fatpipe ARGS` with no terminal on stdin: a question would be a refusal."""
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def aws_toml(key: Path, instance_type: str) -> str:
    return (f'[clusters.{CLUSTER}]\nprovider = "aws"\nregion = "us-east-1"\nnodes = {NODES}\ntier = "1g"\n'
            f'instance_type = "{instance_type}"\nssh_public_key = "{key}"\nssh_cidr = "203.0.113.7/32"\n')


def instances(ec2) -> dict[str, tuple[str, str]]:
    """{node name: (instance id, type)} of the cluster's live instances in the emulator."""
    tagged = [{"Name": "tag:fatpipe:cluster", "Values": [CLUSTER]}]
    found = {}
    for reservation in ec2.describe_instances(Filters=tagged)["Reservations"]:
        for i in reservation["Instances"]:
            if i["State"]["Name"] != "terminated":
                name = next(t["Value"] for t in i["Tags"] if t["Key"] == "Name")
                found[name] = (i["InstanceId"], i["InstanceType"])
    return found


def test_aws_nodes_change_only_when_asked(aws_mirror, moto_server, tmp_path, monkeypatch):  # noqa: F811
    import boto3

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dp@fatpipe", "-f", str(tmp_path / "id")],
                   check=True)
    key, toml = tmp_path / "id.pub", tmp_path / "fatpipe.toml"
    toml.write_text(aws_toml(key, "c5n.xlarge"))
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "1.0.0"\n')
    (tmp_path / "requirements.txt").write_text("einops==0.7.0\n")
    state_dir = tmp_path / ".fatpipe" / CLUSTER
    state_dir.mkdir(parents=True)
    override = emulator_override(moto_server, aws_mirror.version)
    for rule in ("aws_vpc_security_group_ingress_rule.in_from_members", "aws_vpc_security_group_egress_rule.out_to_members"):
        rtype, name = rule.split(".")
        override["resource"].setdefault(rtype, {})[name] = {"lifecycle": {"ignore_changes": list(MOTO_DRIFT)}}
    (state_dir / "emulator_override.tf.json").write_text(json.dumps(override))
    (tmp_path / "ssh_config").write_text("Host *\n  ProxyCommand /bin/false\n")  # never leave this machine
    credentials = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_ENDPOINT_URL": moto_server}
    env = {**os.environ, **aws_mirror.env, **credentials, "FATPIPE_SSH_CONFIG": str(tmp_path / "ssh_config"),
           "FATPIPE_TORCH": "torch==2.12.0"}
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_server)
    state = state_dir / "terraform.tfstate"
    try:
        first = fatpipe(tmp_path, env, "deploy", "--engine", "terraform", "--yes")
        assert first.returncode == 0, first.stdout + first.stderr
        made = instances(ec2)
        assert sorted(made) == [f"{CLUSTER}-{i}" for i in range(NODES)]

        # What changes with the project: nothing of it is any node's.
        (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "1.0.1"\n')
        (tmp_path / "requirements.txt").write_text("einops==0.8.0\ntiktoken\n")
        bumped = fatpipe(tmp_path, {**env, "FATPIPE_TORCH": "torch==2.13.0"}, "deploy", "--engine", "terraform", "--yes", "-v")
        assert bumped.returncode == 0, bumped.stdout + bumped.stderr
        assert re.search(r"Apply complete! Resources: 0 added, \d+ changed, 0 destroyed", bumped.stderr), bumped.stderr[-3000:]
        assert "replace" not in bumped.stdout and "stop and start" not in bumped.stdout
        assert instances(ec2) == made

        # Another machine type: EC2 stops and starts each instance. Refused without --replace.
        toml.write_text(aws_toml(key, "c5n.2xlarge"))
        before = digest(state)
        refused = fatpipe(tmp_path, env, "deploy", "--engine", "terraform", "--yes")
        assert refused.returncode != 0
        lines = [line for line in refused.stdout.splitlines() if re.match(rf"{CLUSTER}-\d: ", line)]
        assert lines == [f"{CLUSTER}-{i}: stop and start (instance_type c5n.xlarge -> c5n.2xlarge); holds: unknown "
                         "(no run or data push recorded here)" for i in range(NODES)], refused.stdout
        assert "nothing was changed" in refused.stderr and "--replace" in refused.stderr
        assert digest(state) == before and instances(ec2) == made

        replaced = fatpipe(tmp_path, env, "deploy", "--engine", "terraform", "--yes", "--replace")
        assert replaced.returncode == 0, replaced.stdout + replaced.stderr
        assert instances(ec2) == {name: (iid, "c5n.2xlarge") for name, (iid, _) in made.items()}
    finally:
        down = fatpipe(tmp_path, env, "down", "--engine", "terraform")
    assert down.returncode == 0, down.stdout + down.stderr


# -- sim: terraform_data nodes, both engines ---------------------------------------------------------

SIM = "dp-lb"


def sim_toml(tier: str, nodes: int = 2) -> str:
    return (f'[clusters.{SIM}]\nprovider = "sim"\nnodes = {nodes}\ntier = "{tier}"\nisolation = "loopback"\n'
            f'private_cidr = "10.210.0.0/24"\n')


@pytest.mark.parametrize("engine", ["terraform", "cdktf"])
def test_sim_nodes_are_replaced_or_destroyed_only_when_asked(engine, tmp_path):
    from fatpipe.stacks.engine import CDKTF_LOCAL

    repo = Path(__file__).resolve().parents[2]
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform on PATH")
    if engine == "cdktf" and not ((repo / CDKTF_LOCAL).is_file() or shutil.which("cdktf")):
        skip_or_fail("needs the cdktf CLI (make cdktf-cli)")
    toml, env = tmp_path / "fatpipe.toml", {k: v for k, v in os.environ.items() if k != "FATPIPE_CONFIG"}
    toml.write_text(sim_toml("1g"))
    state = tmp_path / ".fatpipe" / SIM / "terraform.tfstate"
    try:
        assert fatpipe(tmp_path, env, "deploy", "--engine", engine).returncode == 0
        before = digest(state)
        ready = {p: p.read_bytes() for p in (tmp_path / ".fatpipe" / SIM / "nodes").rglob("ready*")}
        assert len(ready) == 2, ready

        toml.write_text(sim_toml("10g"))
        refused = fatpipe(tmp_path, env, "deploy", "--engine", engine)
        assert refused.returncode != 0
        assert [line for line in refused.stdout.splitlines() if line.startswith(f"{SIM}-")] == [
            f"{SIM}-{i}: replace (rate_gbit 1 -> 10, tier 1g -> 10g); holds: unknown (no run or data push recorded here)"
            for i in range(2)], refused.stdout
        assert digest(state) == before and all(p.read_bytes() == b for p, b in ready.items())
        assert not list((tmp_path / "cdktf.out").rglob("fatpipe.tfplan"))  # the refused plan is not kept

        replaced = fatpipe(tmp_path, env, "deploy", "--engine", engine, "--replace")
        assert replaced.returncode == 0, replaced.stdout + replaced.stderr
        outputs = json.loads((tmp_path / ".fatpipe" / SIM / "outputs.json").read_text())
        assert outputs["tier_gbps"] == 10

        toml.write_text(sim_toml("10g", nodes=1))
        refused = fatpipe(tmp_path, env, "deploy", "--engine", engine)
        assert refused.returncode != 0 and f"{SIM}-1: destroy (no longer declared); holds: " in refused.stdout
        assert len(json.loads((tmp_path / ".fatpipe" / SIM / "outputs.json").read_text())["nodes"]) == 2
    finally:
        toml.write_text(sim_toml("10g"))
        down = fatpipe(tmp_path, env, "down", "--engine", engine)
    assert down.returncode == 0, down.stdout + down.stderr
