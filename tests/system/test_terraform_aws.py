"""Every AWS stack fatpipe synthesizes passes `terraform validate` with the real hashicorp/aws
provider (from a filesystem mirror), and literal text reaches Terraform unchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from fatpipe.stacks.literals import literal

from .conftest import terraform

# Each tier, a GPU cluster, an S3 backend and nodes in three regions (a provider alias each, every
# pair peered): the variants whose JSON differs.
CLUSTERS = {
    "aws1g": 'tier = "1g"',
    "aws10g": 'tier = "10g"',
    "aws25g": 'tier = "25g"',
    "awsgpu": 'tier = "10g"\ngpus_per_node = 1',
    "awss3": 'tier = "10g"\nbackend = { type = "s3", bucket = "tf-state", region = "us-east-1" }',
    "awsregions": 'tier = "10g"\nregions = ["us-east-1", "us-west-2", "eu-west-1"]\nmax_rtt_ms = 150',
}
# A key comment with Terraform template syntax in it: it must reach the node as written.
HOSTILE = "${evil} %{ if true }x%{ endif } $${kept}"


@pytest.fixture(scope="module")
def aws_stacks(tmp_path_factory):
    """Synthesize every variant once with `fatpipe synth`; {cluster: stack folder}."""
    folder = tmp_path_factory.mktemp("aws-stacks")
    key = folder / "id.pub"
    key.write_text(f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyForValidationOnly {HOSTILE}\n")
    tables = [f'[clusters.{name}]\nprovider = "aws"\nregion = "us-east-1"\nnodes = 3\n{extra}\n'
              f'ssh_public_key = "{key}"\nssh_cidr = "203.0.113.7/32"\n' for name, extra in CLUSTERS.items()]
    (folder / "fatpipe.toml").write_text("\n".join(tables))
    proc = subprocess.run([sys.executable, "-m", "fatpipe.cli", "synth", "--json"], cwd=folder,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {name: folder / "cdktf.out" / "stacks" / name for name in CLUSTERS}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CLUSTERS))
def test_aws_stack_validates_with_the_real_provider(aws_mirror, aws_stacks, tmp_path, name):
    doc = json.loads((aws_stacks[name] / "cdk.tf.json").read_text())
    pinned = doc["terraform"]["required_providers"]["aws"]["version"]
    scratch = tmp_path / name
    shutil.copytree(aws_stacks[name], scratch)
    aws_mirror.pin(scratch)
    print(f"{name}: the stack pins hashicorp/aws {pinned}; validating against the mirror's {aws_mirror.version}")
    # The S3 backend is not contacted: validation is about the configuration.
    init = terraform(["init", "-input=false", "-backend=false"], scratch, aws_mirror.env)
    assert init.returncode == 0, init.stdout + init.stderr
    validate = terraform(["validate"], scratch, aws_mirror.env)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "The configuration is valid" in validate.stdout


def test_backend_and_version_requirements(aws_stacks):
    s3 = json.loads((aws_stacks["awss3"] / "cdk.tf.json").read_text())["terraform"]
    assert s3["backend"]["s3"]["use_lockfile"] is True and s3["required_version"] == ">= 1.10"
    local = json.loads((aws_stacks["aws1g"] / "cdk.tf.json").read_text())["terraform"]
    assert "s3" not in local["backend"] and local["required_version"] == ">= 1.4"


def test_literal_text_reaches_terraform_unchanged(tmp_path):
    """A real terraform apply of locals: what `literal` escapes comes back exactly as written."""
    if not shutil.which("terraform"):
        pytest.skip("terraform not found")
    texts = [HOSTILE, "IFACE=${found% *}", "100%{", "$$HOME %%d", "${", "%{", "$${a}", "plain"]
    config = {"output": {f"t{i}": {"value": literal(t)} for i, t in enumerate(texts)}}
    (tmp_path / "main.tf.json").write_text(json.dumps(config))
    env = {"CHECKPOINT_DISABLE": "1"}
    for step in (["init", "-input=false"], ["apply", "-auto-approve", "-input=false"]):
        proc = terraform(step, tmp_path, env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(terraform(["output", "-json"], tmp_path, env).stdout)
    assert [out[f"t{i}"]["value"] for i in range(len(texts))] == texts

    # Unescaped, the same text is refused: the test can fail.
    (tmp_path / "main.tf.json").write_text(json.dumps({"output": {"t": {"value": "IFACE=${found% *}"}}}))
    assert terraform(["validate"], tmp_path, env).returncode != 0
