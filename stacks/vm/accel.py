"""Whether KVM serves the `vm` guests, asked once per base image (docs/local-vms.md).

QEMU boots the image's kernel under KVM with no root disk: the kernel panics, panic=-1 reboots at
once and -no-reboot ends QEMU. A working KVM prints the kernel's first console line at once and
ends in a second or two; a broken backend (kvm-pvm hangs stock kernels, or QEMU aborts on an MSR it
cannot set) prints nothing, never ends or fails. Each is bounded and falls back to TCG, the
software emulation.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from ..sim.links import bridge_lock
from .image import BaseImage

KVM_DEVICE = "/dev/kvm"
FIRST_LINE_S = 5.0  # the kernel's first console line comes within a second, under TCG too
BOOT_S = 20.0  # a working KVM boots the kernel to its panic in a second or two


def resolve_accel(accel: str, image: BaseImage, log=print) -> str:
    """kvm or tcg. `auto` probes KVM once, records the answer beside the image and says it once."""
    if accel != "auto":
        return accel
    record = image.folder / "accel.json"
    with bridge_lock(f"accel-{image.folder.name}"):
        if record.exists():
            return json.loads(record.read_text())["accel"]
        found, why = probe_kvm(image.kernel)
        log(f"vm: {'KVM works' if found == 'kvm' else 'software emulation (TCG), ' + why}")
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"accel": found, "why": why}) + "\n")
        os.replace(tmp, record)
    return found


def probe_kvm(kernel: Path) -> tuple[str, str]:
    """("kvm", "") when the kernel boots to its end under KVM, else ("tcg", why)."""
    if not os.access(KVM_DEVICE, os.R_OK | os.W_OK):
        return "tcg", f"no usable {KVM_DEVICE}"
    argv = ["qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-m", "256", "-nodefaults",
            "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
            "-kernel", str(kernel), "-append", "console=ttyS0 panic=-1"]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        return "tcg", f"QEMU did not start: {e}"
    try:
        console, ended = _console(proc)
        if not ended:
            if b"\n" not in console:
                return "tcg", f"no console line from a kernel under KVM in {FIRST_LINE_S:g} s"
            return "tcg", f"a kernel under KVM did not finish booting in {BOOT_S:g} s"
        errors = proc.communicate(timeout=5)[1].decode(errors="replace").strip().splitlines()
        if b"Linux version" not in console:
            return "tcg", f"QEMU with KVM failed: {(errors or ['no output'])[-1]}"
        return "kvm", ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _console(proc: subprocess.Popen) -> tuple[bytes, bool]:
    """The guest's console until QEMU closes it (True), or until a bound passes (False): no line
    within FIRST_LINE_S, no end within BOOT_S."""
    start, console, fd = time.monotonic(), b"", proc.stdout.fileno()
    while True:
        limit = start + (BOOT_S if b"\n" in console else min(FIRST_LINE_S, BOOT_S))
        left = limit - time.monotonic()
        if left <= 0:
            return console, False
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                return console, True
            console += chunk
