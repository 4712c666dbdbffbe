"""The `ssh` provider end to end: machines fatpipe did not make, reached and tuned over SSH.

The machines are sim nodes with an sshd each (`transport = "ssh"`): network namespaces on a
shaped bridge, each with its own host key, reached from this machine on their private IPs. The
`ssh` cluster lists them as a user lists rented VPS; `fatpipe up --down-after` tunes them over
SSH (deploy), waits, checks the links, trains, and `down` hands them back as they were.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import fatpipe_cli, free_port

pytestmark = pytest.mark.slow

HOSTS, RENTED = "hosts", "rented"
OCTET = 47
NODES = 3
TRAIN = ["--preset", "tiny", "--steps", "6", "--warmup-steps", "2", "--batch-size", "4", "--seq-len", "64",
         "--max-restarts", "0"]
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-")
PROFILE_SYSCTLS = ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_congestion_control",
                   "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_mtu_probing")


def write_project(folder: Path, port_of_first: int = 22) -> None:
    hosts = "\n".join(
        f'[[clusters.{RENTED}.hosts]]\naddress = "10.{OCTET}.0.{10 + i}"\nprivate_ip = "10.{OCTET}.0.{10 + i}"\n'
        f'port = {port_of_first if i == 0 else 22}\nremote_dir = "{folder}/fatpipe/{i}"\n' for i in range(NODES))
    (folder / "fatpipe.toml").write_text(f"""\
[clusters.{HOSTS}]          # the "rented" machines: bare, reachable over ssh
provider = "sim"
nodes = {NODES}
tier = "1g"
isolation = "netns"
transport = "ssh"
private_cidr = "10.{OCTET}.0.0/24"

[clusters.{RENTED}]         # the same machines, as a user would declare VPS rented anywhere
provider = "ssh"
tier = "1g"
ssh_user = "root"
ssh_key_file = "{folder}/.fatpipe/{HOSTS}/ssh/id_ed25519"
install_packages = false    # these share this machine's packages
private_cidr = "10.{OCTET}.0.0/24"
rdzv_port = {free_port()}

{hosts}
""")
    # The nodes share this machine's files and their folders lie in the project: never ship them.
    (folder / ".gitignore").write_text("/fatpipe/\n")


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout, columns=160)


def node_sysctls(netns: str) -> dict[str, str]:
    read = [subprocess.run(["ip", "netns", "exec", netns, "cat", f"/proc/sys/{name.replace('.', '/')}"],
                           capture_output=True, text=True, timeout=30).stdout for name in PROFILE_SYSCTLS]
    return {name: " ".join(value.split()) for name, value in zip(PROFILE_SYSCTLS, read, strict=True)}


def kernel_defaults() -> dict[str, str]:
    """The namespaced sysctls of a namespace nobody tuned."""
    probe = f"fp-defaults-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", probe], check=True)
    try:
        return node_sysctls(probe)
    finally:
        subprocess.run(["ip", "netns", "del", probe])


def fatpipe_files(folder: Path, index: int) -> list[str]:
    """What fatpipe left on node `index`: its files below the node's root, its project folder."""
    root = folder / ".fatpipe" / HOSTS / "nodes" / f"{HOSTS}-{index}" / "root"
    found = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.stat().st_size]
    remote = folder / "fatpipe" / str(index)
    return found + ([str(remote)] if remote.exists() else [])


@pytest.fixture
def rented_machines(needs_netns, needs_ssh, tmp_path):
    """Three machines with sshd (the sim tunes them over SSH too); removed afterwards whatever happened."""
    write_project(tmp_path)
    deployed = fatpipe(tmp_path, "deploy", HOSTS)
    assert deployed.returncode == 0, deployed.stdout
    try:
        yield tmp_path
    finally:
        fatpipe(tmp_path, "down", RENTED, timeout=300)
        down = fatpipe(tmp_path, "down", HOSTS, timeout=300)
        assert down.returncode == 0, down.stdout
        assert not [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                    if ns.startswith(f"fp-{HOSTS}-")]


def test_up_tunes_trains_and_hands_the_machines_back(rented_machines):
    folder = rented_machines
    defaults = kernel_defaults()

    up = fatpipe(folder, "up", RENTED, "--down-after", "--netcheck", "quick", "--remote-python", sys.executable,
                 *TRAIN, timeout=900)
    assert up.returncode == 0, up.stdout[-6000:]
    report = json.loads(next((folder / ".fatpipe" / RENTED / "runs").glob("*/up.json")).read_text())
    phases = {p["name"]: p for p in report["phases"]}
    assert phases["deploy"]["state"] == "done" and phases["wait"]["state"] == "done"
    assert phases["netcheck"]["state"] == "done" and "passed" in phases["netcheck"]["note"]
    assert report["exit_codes"] == {f"{RENTED}-{i}": 0 for i in range(NODES)}
    assert report["summary"]["final_loss"] > 0 and phases["down"]["state"] == "done"
    # Deploy tuned every machine over SSH; `down` reverted it: files gone, sysctls as they were.
    assert "tuned" in up.stdout
    for i in range(NODES):
        assert fatpipe_files(folder, i) == [], f"node {i} keeps fatpipe files"
        assert node_sysctls(f"fp-{HOSTS}-{i}") == defaults


def test_an_unreachable_host_fails_the_deploy_naming_it(rented_machines):
    folder = rented_machines
    write_project(folder, port_of_first=2222)  # nothing listens there
    up = fatpipe(folder, "up", RENTED, "--down-after", "--netcheck", "off", *TRAIN, timeout=300)
    assert up.returncode != 0
    errors = [line for line in up.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"host {RENTED}-0" in errors[0] and "does not answer over SSH" in errors[0], up.stdout
    report = json.loads(next((folder / ".fatpipe" / RENTED / "runs").glob("*/up.json")).read_text()) \
        if (folder / ".fatpipe" / RENTED / "runs").exists() else None
    assert report is None  # it never got to a run
    assert "deploy" in up.stdout and "failed" in up.stdout
