"""The KVM probe of the `vm` provider (stacks/vm/accel.py) falls back to TCG, bounded, whether QEMU
under KVM boots the kernel, aborts, prints nothing (kvm-pvm hung stock kernels) or never ends.
QEMU here is a script on PATH that behaves as each case did on a real machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from fatpipe.stacks.vm import accel

BOOTS = 'echo "[    0.000000] Linux version 6.1.0-57-cloud-amd64"; echo "[    2.87] Kernel Offset"'
ABORTS = ('echo "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69" >&2; '
          'echo "kvm_buf_set_msrs: Assertion failed." >&2; exit 134')
SILENT = "sleep 30"
HANGS = 'echo "[    0.000000] Linux version 6.1.0-57-cloud-amd64"; sleep 30'


@pytest.fixture
def qemu(tmp_path, monkeypatch):
    """Make `qemu-system-x86_64` run a shell body; the probe's bounds cut to a test's."""
    kvm = tmp_path / "kvm"
    kvm.write_text("")
    monkeypatch.setattr(accel, "KVM_DEVICE", str(kvm))
    monkeypatch.setattr(accel, "FIRST_LINE_S", 1.0)
    monkeypatch.setattr(accel, "BOOT_S", 3.0)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")

    def behave(body: str) -> None:
        script = tmp_path / "qemu-system-x86_64"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return behave


def test_a_kernel_that_boots_to_its_end_under_kvm_gives_kvm(qemu, tmp_path):
    qemu(BOOTS)
    assert accel.probe_kvm(tmp_path / "vmlinuz") == ("kvm", "")


def test_qemu_aborting_under_kvm_gives_tcg_with_its_last_line(qemu, tmp_path):
    qemu(ABORTS)
    why = "QEMU with KVM failed: kvm_buf_set_msrs: Assertion failed."
    assert accel.probe_kvm(tmp_path / "vmlinuz") == ("tcg", why)


@pytest.mark.parametrize("body, why", [(SILENT, "no console line from a kernel under KVM in 1 s"),
                                       (HANGS, "a kernel under KVM did not finish booting in 3 s")])
def test_a_guest_silent_or_hung_under_kvm_gives_tcg_and_is_killed(qemu, tmp_path, body, why):
    qemu(f"echo $$ > {tmp_path}/pid; {body}")
    assert accel.probe_kvm(tmp_path / "vmlinuz") == ("tcg", why)
    pid = int((tmp_path / "pid").read_text())
    assert not (Path("/proc") / str(pid)).exists()  # QEMU's group killed, nothing left


def test_no_kvm_device_gives_tcg_without_starting_qemu(qemu, tmp_path, monkeypatch):
    qemu(f"touch {tmp_path}/started")
    monkeypatch.setattr(accel, "KVM_DEVICE", str(tmp_path / "absent"))
    assert accel.probe_kvm(tmp_path / "vmlinuz") == ("tcg", f"no usable {tmp_path / 'absent'}")
    assert not (tmp_path / "started").exists()
