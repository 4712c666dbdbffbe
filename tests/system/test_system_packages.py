"""`make system-packages`, which `make test` runs first: installs the Debian packages the tests drive
as root, and as anyone else names what is missing instead of failing the suite halfway."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def make_system_packages(*prefix: str, packages: str) -> subprocess.CompletedProcess:
    """The Makefile goes on stdin: another user may not be able to read the checkout's folder."""
    return subprocess.run([*prefix, "make", "-s", "-f", "-", "system-packages", f"SYSTEM_PACKAGES={packages}"],
                          input=(ROOT / "Makefile").read_text(), cwd="/", capture_output=True, text=True, timeout=300)


def test_the_test_command_installs_the_system_packages_first():
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "test"], capture_output=True, text=True, timeout=60)
    assert "dpkg -s" in dry.stdout.split("pytest")[0], dry.stdout  # before any test runs


def test_present_packages_need_nothing():
    done = make_system_packages(packages="iproute2")
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
def test_without_root_the_missing_package_is_named_and_nothing_fails():
    done = make_system_packages("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                packages="iproute2 fatpipe-no-such-package")
    assert done.returncode == 0, done.stderr
    assert "fatpipe-no-such-package" in done.stdout and "iproute2" not in done.stdout
    assert "skipped" in done.stdout
