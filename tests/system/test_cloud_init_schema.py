"""The node profile is valid cloud-config: `cloud-init schema` accepts the user data of every
provider and tier as rendered."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import skip_or_fail

from fatpipe.infra.clusters import AwsCluster, DigitalOceanCluster, SimCluster
from fatpipe.infra.spec import TIER_GBPS
from fatpipe.infra.vmspec import VmCluster
from fatpipe.stacks.providers import PROVIDERS


def cluster(provider: str, tier: str, key: str):
    if provider == "sim":
        return SimCluster(provider="sim", name="s", nodes=2, tier=tier)
    if provider == "vm":  # local VMs booted with a cloud's own user data (DigitalOcean's here)
        return VmCluster(provider="vm", name="v", nodes=2, tier=tier, user_data="digitalocean")
    common = dict(name="c", nodes=3, tier=tier, ssh_public_key=key, ssh_cidr="203.0.113.7/32")
    if provider == "aws":
        return AwsCluster(provider="aws", region="us-east-1", **common)
    return DigitalOceanCluster(provider="digitalocean", region="nyc3", **common)


@pytest.mark.parametrize("tier", list(TIER_GBPS))
# The ssh provider has no user data: its machines get the same profile over SSH.
@pytest.mark.parametrize("provider", [name for name, p in PROVIDERS.items() if p.user_data_limit])
def test_user_data_passes_cloud_init_schema(provider, tier, tmp_path):
    if not shutil.which("cloud-init"):
        skip_or_fail("cloud-init is not installed (Debian package cloud-init)")
    key = tmp_path / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKey ${evil} %{ x }\n")
    path = tmp_path / "user-data"
    path.write_text(PROVIDERS[provider].user_data(cluster(provider, tier, str(key))))
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "Valid cloud-config" in proc.stdout, proc.stdout + proc.stderr


def test_cloud_init_schema_refuses_a_broken_document(tmp_path):
    """The check can fail: a runcmd that is not a list is refused."""
    if not shutil.which("cloud-init"):
        skip_or_fail("cloud-init is not installed (Debian package cloud-init)")
    path = tmp_path / "user-data"
    path.write_text("#cloud-config\n{\"runcmd\": 5}\n")
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "runcmd" in proc.stdout + proc.stderr


def cloud_project(folder, provider: str):
    """A project with one cloud cluster and a `[node]` declaration (packages and a requirements file)."""
    from fatpipe.infra.project import load_project

    (folder / "id.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKey t@t\n")
    where = 'region = "us-east-1"' if provider == "aws" else 'region = "nyc3"'
    (folder / "fatpipe.toml").write_text(f"""\
[clusters.c]
provider = "{provider}"
{where}
nodes = 2
tier = "10g"
ssh_public_key = "{folder / 'id.pub'}"
ssh_cidr = "203.0.113.7/32"

[node]
torch = "torch==2.13.0"
packages = ["tiktoken"]
""")
    (folder / "requirements.txt").write_text("einops\n")
    project = load_project(folder / "fatpipe.toml")
    return project, project.cluster("c")


@pytest.mark.parametrize("provider", ["aws", "digitalocean"])
def test_the_user_data_holds_nothing_of_the_project(provider, tmp_path):
    """The project's version, requirements, packages and torch never reach the user data (launch
    builds the node venv), so changing them never replaces a node; it stays valid cloud-config."""
    if not shutil.which("cloud-init"):
        skip_or_fail("cloud-init is not installed (Debian package cloud-init)")
    project, cluster = cloud_project(tmp_path, provider)
    text = PROVIDERS[provider].user_data(cluster)
    (tmp_path / "user-data").write_text(text)
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(tmp_path / "user-data")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Valid cloud-config" in proc.stdout, proc.stdout + proc.stderr
    for word in ("torch==", "tiktoken", "einops", "node-env"):
        assert word not in text, word
    doc = json.loads(text.split("\n", 1)[1])
    assert doc["runcmd"][-1] == ["/usr/local/sbin/fatpipe-ready"] and "python3-venv" in doc["packages"]
