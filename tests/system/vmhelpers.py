"""What the system tests of `vm` clusters share: the cached base image, a command on a guest over
SSH, and what a cluster may have left on this machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import skip_or_fail

from fatpipe.stacks.vm.image import build_image, default_cache, missing_tools

BOOT_TIMEOUT_S = 1200  # TCG on a loaded 2-core machine: generous, no timing asserted


def vm_image_cache() -> Path:
    """The base image, built once and cached where a user's is (FATPIPE_VM_CACHE, else
    ~/.cache/fatpipe/vm-image): a clean clone finds the image and the wheel disk of the runs before
    it, as a second project of a user does; a changed recipe or requirement list is built anew."""
    if os.geteuid() != 0:
        skip_or_fail("vm nodes need root (taps on a bridge, debootstrap)")
    if missing_tools():
        skip_or_fail(f"needs the Debian packages {' '.join(missing_tools())} (make system-packages, as root)")
    cache = default_cache()
    build_image(cache, log=print)
    return cache


def on_node(folder: Path, cluster: str, ip: str, command: str) -> str:
    key = folder / ".fatpipe" / cluster / "ssh" / "id_ed25519"
    proc = subprocess.run(["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30",
                           f"debian@{ip}", command], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{ip}: {command}: {proc.stderr}"
    return proc.stdout


def leftovers(folder: Path, cluster: str) -> list[str]:
    """QEMU processes, taps, bridges and node files of `cluster` still on the machine."""
    from fatpipe.infra.project import project_id_at
    from fatpipe.stacks.vm.node import vm_names

    names = vm_names(project_id_at(folder, create=False), cluster, 0)
    found = [f"link {link}" for link in os.listdir("/sys/class/net")
             if link == names["bridge"] or link.startswith(names["tap"][:-1])]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    found += [f"process {line[:80]}" for line in ps.splitlines() if f"fatpipe-{cluster}-" in line]
    found += [f"file {p}" for p in (folder / ".fatpipe" / cluster).glob("nodes/*/*")]
    return found


def consoles(folder: Path, cluster: str) -> str:
    """The tail of every guest's console: what a failed boot said."""
    return "".join(p.read_text(errors="replace")[-1500:] for p in folder.glob(f".fatpipe/{cluster}/nodes/*/console.log"))
