"""Shared fixtures: a scratch project folder, the CLI runner, and guards for root-only tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import cpuuse
import pytest
from click.testing import CliRunner

IN_CI = bool(os.environ.get("FATPIPE_CI"))

# A shell starts a background job (`nohup make test &`) with SIGINT ignored, and every child
# inherits that: the tests that press Ctrl-C on fatpipe would then press it on processes that
# cannot hear it. Python's own handler here means each exec'd child starts with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    cpuuse.register(config)  # each test's CPU-seconds, named at the end of the run


def skip_or_fail(reason: str):
    """Skip on a developer's machine; in CI a missing prerequisite is a failure, not a skip."""
    if IN_CI:
        pytest.fail(f"CI must be able to run this test: {reason}")
    pytest.skip(reason)


def netns_available() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    # A name of this process's own: the lanes of `make test` probe at the same time, and one's
    # `del` of a shared name made another's `add` fail (a test then failed in CI for "no netns").
    probe = f"fatpipe-probe-{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


@pytest.fixture
def needs_netns():
    if not netns_available():
        skip_or_fail("needs root and `ip netns`")


@pytest.fixture
def project_dir(tmp_path, monkeypatch):
    """An empty folder as the current directory, with no FATPIPE_CONFIG leaking in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FATPIPE_CONFIG", raising=False)
    return tmp_path


@pytest.fixture
def run_cli(project_dir):
    """Invoke `fatpipe ARGS...` in-process; returns click's Result."""
    from fatpipe.cli.main import cli

    runner = CliRunner()

    def run(*args: str, input: str | None = None):
        return runner.invoke(cli, list(args), input=input, catch_exceptions=False)

    return run


@pytest.fixture(scope="session", autouse=True)
def stale_sim_nodes_removed():
    """Before the tests: remove sim namespaces whose project folder is gone (an earlier run that
    was killed left them), so a test's fixed cluster name is free. A live cluster of a folder that
    still exists is left alone, as `fatpipe down` would leave it."""
    if not netns_available():
        yield
        return
    from pathlib import Path

    from fatpipe.stacks.sim.links import bridge_ports, kill_netns_processes, netns_list, run
    from fatpipe.stacks.sim.owner import netns_owner

    for netns in netns_list():
        folder = netns_owner(netns).partition(" ")[2]
        if netns.startswith("fp-") and not (folder and Path(folder).is_dir()):
            kill_netns_processes(netns, lambda _: None)
            run(["ip", "netns", "del", netns], check=False)
    for bridge in (p.name for p in Path("/sys/class/net").glob("fpbr-*")):
        if not bridge_ports(bridge):
            run(["ip", "link", "del", bridge], check=False)
    yield
