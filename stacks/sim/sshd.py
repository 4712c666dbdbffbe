"""A sim node reached over SSH, as a rented machine is: an sshd inside the node's namespace, on its
private IP, with a host key of its own, logging in with the cluster's key.

The node shares this machine's files, so its sessions get FATPIPE_ROOT (its own folder): the
node profile writes below it and leaves the host's /etc alone.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from .links import bridge_lock, run

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
START_TIMEOUT_S = 10


def cluster_key(state_dir: Path, bridge: str) -> Path:
    """The cluster's login key (made once; nodes come up in parallel, so under the bridge lock)."""
    key = Path(state_dir) / "ssh" / "id_ed25519"
    with bridge_lock(bridge):
        if not key.exists():
            key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fatpipe-sim@{bridge}", "-f", str(key)])
    return key.resolve()


def host_address(bridge: str, address: str) -> None:
    """Give this machine the private network's first address on the bridge, so it reaches nodes
    on their private IPs as a laptop reaches rented machines."""
    net = ipaddress.IPv4Interface(address).network
    mine = f"{net.network_address + 1}/{net.prefixlen}"
    with bridge_lock(bridge):
        shown = run(["ip", "-o", "-4", "addr", "show", "dev", bridge]).stdout
        if mine.split("/")[0] + "/" not in shown:
            run(["ip", "addr", "add", mine, "dev", bridge])


def start_sshd(netns: str, ip: str, node_dir: Path, key: Path) -> None:
    """Start the node's sshd (it daemonizes inside the namespace) and wait until it answers."""
    if not Path(SSHD).exists():
        raise FatpipeError("sim nodes over ssh need sshd (Debian: openssh-server)")
    folder = Path(node_dir).resolve() / "sshd"
    folder.mkdir(parents=True, exist_ok=True)
    host_key = folder / "host_key"
    if not host_key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)])
    root = Path(node_dir).resolve() / "root"
    root.mkdir(exist_ok=True)
    config = folder / "sshd_config"
    config.write_text(f"""\
ListenAddress {ip}
Port 22
HostKey {host_key}
AuthorizedKeysFile {key}.pub
PidFile {folder / 'sshd.pid'}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 64
MaxStartups 64
SetEnv FATPIPE_ROOT={root}
""")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    run(["ip", "netns", "exec", netns, SSHD, "-f", str(config), "-E", str(folder / "sshd.log")])
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        probe = subprocess.run(["ip", "netns", "exec", netns, "bash", "-c", f"</dev/tcp/{ip}/22"],
                               capture_output=True, timeout=5)
        if probe.returncode == 0:
            return
        time.sleep(0.1)
    log = (folder / "sshd.log").read_text(errors="replace")[-300:] if (folder / "sshd.log").exists() else ""
    raise FatpipeError(f"the sshd of namespace {netns} did not start: {log}")
