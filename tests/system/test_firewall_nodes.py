"""An `ssh` cluster that declares no private_cidr: its host firewall trusts its own nodes, not the
network that happens to hold them (docs/ARCHITECTURE.md, "The node firewall").

Three bare sim machines with sshd (10.217.0.10-12); the `ssh` cluster is machines 0 and 2 only.
The smallest network holding both, 10.217.0.8/29, also holds machine 1, which stands for another
tenant of the provider's private network (or another device of a tailnet): after deploy it no
longer reaches node 0's rendezvous port, node 2 still does, and SSH answers both.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import PORT_LISTENER, fatpipe_cli

pytestmark = pytest.mark.slow

HOSTS, RENTED = "tr-fwh", "tr-fwr"
OCTET = 217
RDZV_PORT = 29417
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-trfw-")
MEMBERS = (0, 2)  # machine 1 lies between them, inside the network that would hold both


def netns(index: int) -> str:
    return f"fp-{HOSTS}-{index}"


def private_ip(index: int) -> str:
    return f"10.{OCTET}.0.{10 + index}"


def project(folder: Path) -> str:
    hosts = "".join(f'[[clusters.{RENTED}.hosts]]\naddress = "{private_ip(i)}"\nprivate_ip = "{private_ip(i)}"\n'
                    f'remote_dir = "{folder}/fatpipe/{i}"\n' for i in MEMBERS)
    return f"""\
[clusters.{HOSTS}]
provider = "sim"
nodes = 3
tier = "1g"
isolation = "netns"
transport = "ssh"
firewall = false
private_cidr = "10.{OCTET}.0.0/24"

[clusters.{RENTED}]
provider = "ssh"
tier = "1g"
ssh_user = "root"
ssh_key_file = "{folder}/.fatpipe/{HOSTS}/ssh/id_ed25519"
install_packages = false
rdzv_port = {RDZV_PORT}

{hosts}"""


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


def connects(ns: str, host: str, port: int) -> bool:
    probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
             "except OSError:\n    sys.exit(3)\n")
    done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe, host, str(port)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode == 0


def test_a_node_trusts_the_other_nodes_and_not_their_neighbour(needs_netns, needs_ssh, tmp_path):
    (tmp_path / "fatpipe.toml").write_text(project(tmp_path))
    config = fatpipe(tmp_path, "config", RENTED, "--json")
    assert config.returncode == 0, config.stdout
    assert f"{private_ip(0)}/32" in config.stdout and "10.217.0.8/29" not in config.stdout
    listener = None
    try:
        deployed = fatpipe(tmp_path, "deploy", HOSTS)
        assert deployed.returncode == 0, deployed.stdout
        listener = subprocess.Popen(["ip", "netns", "exec", netns(0), sys.executable, "-c", PORT_LISTENER,
                                     str(RDZV_PORT)], stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "listening"
        assert connects(netns(1), private_ip(0), RDZV_PORT)  # bare: open to the neighbour

        deployed = fatpipe(tmp_path, "deploy", RENTED)
        assert deployed.returncode == 0, deployed.stdout
        waited = fatpipe(tmp_path, "wait", RENTED, "--wait-timeout", "120")
        assert waited.returncode == 0, waited.stdout
        assert connects(netns(2), private_ip(0), RDZV_PORT)  # the other node
        assert not connects(netns(1), private_ip(0), RDZV_PORT)  # the neighbour inside 10.217.0.8/29
        assert connects(netns(1), private_ip(0), 22)  # SSH from anywhere
    finally:
        if listener:
            listener.kill()
            listener.wait(30)
        fatpipe(tmp_path, "down", RENTED, timeout=300)
        down = fatpipe(tmp_path, "down", HOSTS, timeout=300)
        assert down.returncode == 0, down.stdout
