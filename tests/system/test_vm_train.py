"""`fatpipe up` on a `vm` cluster, every phase on real kernels: 2 QEMU VMs booted with the AWS user
data build their node venv at boot from the read-only wheel disk (no index reachable), `wait`
passes on the real boot, `netcheck --quick` passes between the VMs, the built-in trainer runs a
few steps over gloo on both, and `--down-after` leaves no QEMU, tap, bridge or node file.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import fatpipe_cli, free_port
from .vmhelpers import BOOT_TIMEOUT_S, consoles, leftovers, vm_image_cache

# TCG boots, torch installed from wheels in the guests and a short run: many minutes on 2 cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

CLUSTER = "vmtrain"
OCTET = 182
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-vmt-")
TRAIN = ["--preset", "tiny", "--steps", "4", "--warmup-steps", "1", "--batch-size", "2", "--seq-len", "32",
         "--max-restarts", "0", "--join-timeout", "900"]


def fatpipe(folder: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


def test_up_on_two_vms_trains_and_down_leaves_nothing(needs_ssh, tmp_path, monkeypatch):
    monkeypatch.setenv("FATPIPE_VM_CACHE", str(vm_image_cache()))  # the stack records it for node-up
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
        up = fatpipe(folder, "up", CLUSTER, "--down-after", "--netcheck", "quick",
                     "--wait-timeout", str(BOOT_TIMEOUT_S * 2), *TRAIN, timeout=3000)
        assert up.returncode == 0, up.stdout[-6000:] + consoles(folder, CLUSTER)
        report = json.loads(next((folder / ".fatpipe" / CLUSTER / "runs").glob("*/up.json")).read_text())
        phases = {p["name"]: p for p in report["phases"]}
        assert all(phases[name]["state"] == "done" for name in ("deploy", "wait", "netcheck", "down")), phases
        assert "passed" in phases["netcheck"]["note"]
        assert report["exit_codes"] == {f"{CLUSTER}-{i}": 0 for i in range(2)}
        assert report["summary"]["final_loss"] > 0
    finally:
        if leftovers(folder, CLUSTER):
            fatpipe(folder, "down", CLUSTER, timeout=600)
    assert leftovers(folder, CLUSTER) == []
