"""The `vm` provider, booted: 2 QEMU VMs with real kernels configured by the AWS user data.

What a namespace cannot show is checked on the guests: cloud-init finishes `done`, the tier's
sysctls read back including the kernel-wide rmem_max/wmem_max, the private NIC's root qdisc is
fq, `fatpipe wait` passes; and `down` leaves no QEMU, overlay, tap or bridge. On a machine
without KVM the guests run under TCG (about a minute per boot; they boot in parallel).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from fatpipe.infra.tiers import normalize_sysctl, tier_profile

from .conftest import fatpipe_cli, free_port
from .vmhelpers import BOOT_TIMEOUT_S, consoles, leftovers, on_node, vm_image_cache

# The image build (once, cached) and TCG boots on a loaded 2-core machine: minutes each.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]

CLUSTER = "vmboot"
OCTET = 181
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-vm-")


@pytest.fixture(scope="session")
def vm_cache() -> Path:
    return vm_image_cache()


def fatpipe(folder: Path, *args: str, timeout: float = BOOT_TIMEOUT_S) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


def test_two_vms_boot_the_aws_user_data_and_down_leaves_nothing(vm_cache, needs_ssh, tmp_path, monkeypatch):
    monkeypatch.setenv("FATPIPE_VM_CACHE", str(vm_cache))  # the stack records it for node-up
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "fatpipe.toml").write_text(f"""\
[clusters.{CLUSTER}]
provider = "vm"
nodes = 2
tier = "1g"
user_data = "aws"
private_cidr = "10.{OCTET}.0.0/24"
rdzv_port = {free_port()}
""")
    try:
        deployed = fatpipe(folder, "deploy", CLUSTER)
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        waited = fatpipe(folder, "wait", CLUSTER, "--wait-timeout", str(BOOT_TIMEOUT_S))
        assert waited.returncode == 0, waited.stdout[-4000:] + consoles(folder, CLUSTER)
        profile = tier_profile("1g")
        assert {"net.core.rmem_max", "net.core.wmem_max"} <= set(profile.sysctls)
        for index in range(2):
            ip = f"10.{OCTET}.0.{10 + index}"
            status = on_node(folder, CLUSTER, ip, "cloud-init status --long || true")
            assert re.search(r"^status: done$", status, re.M), status
            names = list(profile.sysctls)
            values = on_node(folder, CLUSTER, ip, "/usr/sbin/sysctl -n " + " ".join(names)).splitlines()
            assert {n: normalize_sysctl(v) for n, v in zip(names, values, strict=True)} == profile.sysctls
            links = json.loads(on_node(folder, CLUSTER, ip, "ip -j -4 addr show"))
            iface = next(link["ifname"] for link in links
                         if any(a["local"] == ip for a in link.get("addr_info", [])))
            assert on_node(folder, CLUSTER, ip, f"/usr/sbin/tc qdisc show dev {iface} root").split()[1] == "fq"
            ready = json.loads(on_node(folder, CLUSTER, ip, "cat /var/lib/fatpipe/ready"))
            assert ready["iface"] == iface and ready["mtu"] == 9001 and all(ready["packages"].values())
    finally:
        down = fatpipe(folder, "down", CLUSTER, timeout=300)
    assert down.returncode == 0, down.stdout[-4000:]
    assert leftovers(folder, CLUSTER) == []
