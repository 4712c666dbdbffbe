"""The node profile is valid cloud-config: `cloud-init schema` accepts the user data of every
provider and tier as rendered."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import skip_or_fail

from fatpipe.infra.clusters import AwsCluster, DigitalOceanCluster, SimCluster
from fatpipe.infra.spec import TIER_GBPS
from fatpipe.stacks.providers import PROVIDERS


def cluster(provider: str, tier: str, key: str):
    if provider == "sim":
        return SimCluster(provider="sim", name="s", nodes=2, tier=tier)
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
