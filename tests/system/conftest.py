"""System-test fixtures: a real sshd on a loopback port, and outputs that reach it."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import skip_or_fail

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path_factory, monkeypatch):
    """A private sshd on 127.0.0.1 and an ssh config that reaches it; yields the config path."""
    if not Path(SSHD).exists() or not shutil.which("ssh") or not shutil.which("rsync"):
        skip_or_fail("needs openssh-server, openssh-client and rsync")
    base = tmp_path_factory.mktemp("sshd")
    keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
    subprocess.run([*keygen, "-f", str(base / "host_key")], check=True)
    subprocess.run([*keygen, "-f", str(base / "user_key")], check=True)
    shutil.copy(base / "user_key.pub", base / "authorized_keys")
    port = free_port()
    (base / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {base / 'host_key'}
AuthorizedKeysFile {base / 'authorized_keys'}
PidFile {base / 'sshd.pid'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
MaxSessions 64
MaxStartups 64
""")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(base / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(base / "sshd.log", "w"))
    (base / "ssh_config").write_text(f"""\
Host 127.0.0.1
  Port {port}
  User {getpass.getuser()}
  IdentityFile {base / 'user_key'}
  IdentitiesOnly yes
""")
    monkeypatch.setenv("FATPIPE_SSH_CONFIG", str(base / "ssh_config"))
    monkeypatch.setenv("FATPIPE_REMOTE_DIR", str(base / "remote" / "{node}"))
    monkeypatch.setenv("FATPIPE_SSH_CONTROL_DIR", str(base / "cm"))
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail("sshd did not start: " + (base / "sshd.log").read_text())
        time.sleep(0.1)
    yield base
    proc.terminate()
    proc.wait(10)
    # The multiplexing masters (ControlPersist) of this test's connections outlive sshd's listener.
    for sock in (base / "cm").glob("*"):
        subprocess.run(["ssh", "-F", str(base / "ssh_config"), "-o", f"ControlPath={sock}", "-O", "exit",
                        "127.0.0.1"], capture_output=True, timeout=10)


def ssh_outputs(rdzv_port: int) -> dict:
    return {
        "name": "demo", "provider": "aws", "region": "us-east-1", "tier_gbps": 10,
        "private_cidr": "10.42.0.0/24", "rdzv_port": rdzv_port,
        "nodes": [{"name": f"demo-{i}", "public_ip": "127.0.0.1", "private_ip": f"127.0.0.{10 + i}",
                   "transport": "ssh"} for i in range(2)],
    }
