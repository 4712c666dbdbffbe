"""CPU-seconds per test, of the test's whole process tree (torchrun, sshd, terraform, QEMU...).

The suite is CPU-bound on CI's two cores (docs/testing.md), so what a test costs is its CPU, not
its wall time, which the other lane stretches. With root and a cgroup-v1 `cpuacct` hierarchy, the
pytest process moves into a cgroup of its own at the start (every process it starts after inherits
it) and each test's share of that group's CPU is measured; the run ends with the costliest tests
and the lane's total. Without them nothing is measured and nothing changes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
SHOWN = 15


def own_group() -> Path | None:
    """A cpuacct cgroup holding this process from now on; None where none can be made."""
    if os.geteuid() != 0 or not (CPUACCT / "cgroup.procs").exists():
        return None
    for stale in CPUACCT.glob("fatpipe-tests-*"):  # an earlier run's, left while a child still ended
        pid = stale.name.rsplit("-", 1)[-1]
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            try:
                stale.rmdir()  # only an empty group goes
            except OSError:
                pass
    group = CPUACCT / f"fatpipe-tests-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        return group
    except OSError:
        return None


class CpuUse:
    def __init__(self, group: Path):
        self.group, self.used = group, {}

    def usage_s(self) -> float:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        before = self.usage_s()
        yield
        self.used[item.nodeid] = self.usage_s() - before

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_sep("=", f"most CPU-seconds per test ({len(self.used)} tests, this lane's processes)")
        for nodeid, seconds in sorted(self.used.items(), key=lambda kv: -kv[1])[:SHOWN]:
            terminalreporter.write_line(f"{seconds:8.2f}s cpu  {nodeid}")
        terminalreporter.write_line(f"{self.usage_s():8.2f}s cpu  in all (the lane's whole run)")

    def pytest_unconfigure(self, config):
        try:  # back to the root group; the group goes once nothing is left in it
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        except OSError:
            pass


def register(config) -> None:
    group = own_group()
    if group is not None:
        config.pluginmanager.register(CpuUse(group), "cpuuse")
