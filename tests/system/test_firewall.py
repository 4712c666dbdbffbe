"""The host firewall of an `ssh` cluster, on machines reached over SSH: nothing but SSH from outside.

The machines are sim nodes with an sshd each (`transport = "ssh"`, `firewall = false`: bare, as a
fresh VPS is). A second namespace is "the internet": a veth into node 0 with an address outside
private_cidr and a route to the private network through it. The `ssh` cluster over those machines
gets the firewall on deploy; from the internet the rendezvous port and a gloo-range port no longer
answer, from the other node they do (not from this machine, inside private_cidr but no node), SSH
still does from anywhere, and `down` hands back each node's ruleset exactly as it was (node 0 has
a table of its own beforehand).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import PORT_LISTENER as LISTENER
from .conftest import fatpipe_cli, rented_sim_toml

pytestmark = pytest.mark.slow

HOSTS, RENTED = "fwall-hosts", "fwall-rented"
OCTET = 151
NODES = 2
RDZV_PORT = 29400
GLOO_PORT = 45123  # a port of the range gloo's pairs listen on (ephemeral)
INTERNET = f"fwall-inet-{os.getpid()}"  # not fp-*: sweeps of sim namespaces must not take it
INTERNET_IP, NODE0_OUTSIDE_IP = "198.51.100.2", "198.51.100.1"  # TEST-NET-2: outside private_cidr
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-fw-")


def netns(index: int) -> str:
    return f"fp-{HOSTS}-{index}"


def private_ip(index: int) -> str:
    return f"10.{OCTET}.0.{10 + index}"


def write_project(folder: Path) -> None:
    # The sim machines start bare (no firewall yet); the ssh cluster has it on by default.
    remote_dirs = [f"{folder}/fatpipe/{i}" for i in range(NODES)]
    (folder / "fatpipe.toml").write_text(rented_sim_toml(folder, HOSTS, RENTED, OCTET, remote_dirs, rdzv_port=RDZV_PORT,
                                                         sim_extra="firewall = false\n"))


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


def sh(*argv: str, ns: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=timeout)


def connects(ns: str | None, host: str, port: int) -> bool:
    """Whether a TCP connect from namespace `ns` (None: this machine) to host:port succeeds."""
    probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
             "except OSError:\n    sys.exit(3)\n")
    done = sh(sys.executable, "-c", probe, host, str(port), ns=ns)
    assert done.returncode in (0, 3), done.stderr  # anything else is the probe failing, not the connect
    return done.returncode == 0


def ruleset(index: int) -> str:
    listed = sh("nft", "list", "ruleset", ns=netns(index))
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


def attach_internet() -> None:
    """A namespace outside private_cidr, wired to node 0 and routed to the private network through it."""
    outside, inside = f"fwi{os.getpid() % 100000}a", f"fwi{os.getpid() % 100000}b"
    for argv in (["ip", "netns", "add", INTERNET],
                 ["ip", "link", "add", outside, "type", "veth", "peer", "name", inside],
                 ["ip", "link", "set", outside, "netns", INTERNET], ["ip", "link", "set", inside, "netns", netns(0)],
                 ["ip", "-n", INTERNET, "addr", "add", f"{INTERNET_IP}/30", "dev", outside],
                 ["ip", "-n", INTERNET, "link", "set", outside, "up"], ["ip", "-n", INTERNET, "link", "set", "lo", "up"],
                 ["ip", "-n", netns(0), "addr", "add", f"{NODE0_OUTSIDE_IP}/30", "dev", inside],
                 ["ip", "-n", netns(0), "link", "set", inside, "up"],
                 ["ip", "-n", INTERNET, "route", "add", f"10.{OCTET}.0.0/24", "via", NODE0_OUTSIDE_IP]):
        subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def machines(needs_netns, needs_ssh, tmp_path):
    """Two bare machines with sshd, node 0 also on "the internet"; all removed afterwards."""
    write_project(tmp_path)
    deployed = fatpipe(tmp_path, "deploy", HOSTS)
    assert deployed.returncode == 0, deployed.stdout
    listener = None
    try:
        attach_internet()
        listener = subprocess.Popen(["ip", "netns", "exec", netns(0), sys.executable, "-c", LISTENER,
                                     str(RDZV_PORT), str(GLOO_PORT)], stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "listening"
        yield tmp_path
    finally:
        if listener:
            listener.kill()
            listener.wait()
        fatpipe(tmp_path, "down", RENTED, timeout=300)
        subprocess.run(["ip", "netns", "del", INTERNET], capture_output=True)
        down = fatpipe(tmp_path, "down", HOSTS, timeout=300)
        assert down.returncode == 0, down.stdout


def test_only_ssh_is_open_to_the_internet_and_down_hands_the_ruleset_back(machines):
    folder, node0 = machines, private_ip(0)
    # The machines as rented: open to anyone (which is what the firewall is for), and node 0 has
    # a table of its own that the firewall must leave as it is.
    assert connects(INTERNET, node0, RDZV_PORT) and connects(INTERNET, NODE0_OUTSIDE_IP, GLOO_PORT)
    theirs = "table inet theirs {\n\tchain input {\n\t\ttype filter hook input priority 10; policy accept;\n" \
             "\t\ttcp dport 8080 accept\n\t}\n}\n"
    assert subprocess.run(["ip", "netns", "exec", netns(0), "nft", "-f", "-"], input=theirs, text=True,
                          timeout=30).returncode == 0
    before = [ruleset(i) for i in range(NODES)]
    assert "table inet theirs" in before[0]

    deployed = fatpipe(folder, "deploy", RENTED)
    assert deployed.returncode == 0, deployed.stdout
    assert all("table inet fatpipe" in ruleset(i) for i in range(NODES))
    waited = fatpipe(folder, "wait", RENTED, "--wait-timeout", "120")
    assert waited.returncode == 0, waited.stdout

    for port in (RDZV_PORT, GLOO_PORT):  # the internet reaches neither, on either address
        assert not connects(INTERNET, node0, port), port
        assert not connects(INTERNET, NODE0_OUTSIDE_IP, port), port
        # This machine (the bridge's address in private_cidr) is no node: the run's ports and the
        # ephemeral range are the nodes' alone; another node reaches them.
        assert not connects(None, node0, port), port
        assert connects(netns(1), node0, port), port
    login = sh("ssh", "-F", "/dev/null", "-i", f"{folder}/.fatpipe/{HOSTS}/ssh/id_ed25519", "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
               f"root@{node0}", "echo", "still-in", ns=INTERNET)
    assert login.returncode == 0 and "still-in" in login.stdout, login.stderr  # SSH stays open

    # A node whose rules went away: wait says so, a launch is refused naming it, nothing starts.
    assert sh("nft", "delete", "table", "inet", "fatpipe", ns=netns(1)).returncode == 0
    waited = fatpipe(folder, "wait", RENTED, "--wait-timeout", "3")
    assert waited.returncode != 0 and f"{RENTED}-1" in waited.stdout and "no firewall" in waited.stdout
    launched = fatpipe(folder, "launch", RENTED, "--remote-python", sys.executable, "--preset", "tiny",
                       "--steps", "4", "--warmup-steps", "1")
    errors = [line for line in launched.stdout.splitlines() if line.lower().startswith("error:")]
    assert launched.returncode != 0 and len(errors) == 1, launched.stdout
    assert f"node {RENTED}-1: no firewall" in errors[0]
    assert not (folder / "fatpipe").exists(), "a node was prepared anyway"

    down = fatpipe(folder, "down", RENTED, timeout=300)
    assert down.returncode == 0, down.stdout
    assert [ruleset(i) for i in range(NODES)] == before
    assert connects(INTERNET, node0, RDZV_PORT)  # handed back: open as it was
