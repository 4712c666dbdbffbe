"""System-test fixtures: a real sshd on a loopback port, and terraform with the real AWS provider."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import netns_available, skip_or_fail

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether a server `proc` listens on 127.0.0.1:`port` within `timeout_s` (False: it died or is late)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_ssh() -> None:
    """sshd, ssh and rsync, which `make system-packages` installs as root."""
    missing = [package for package, present in (("openssh-server", Path(SSHD).exists()),
               ("openssh-client", shutil.which("ssh")), ("rsync", shutil.which("rsync"))) if not present]
    if missing:
        skip_or_fail(f"needs the Debian packages {' '.join(missing)} (make system-packages, as root)")


@pytest.fixture
def needs_ssh():
    require_ssh()


def require_ssh_sim() -> None:
    """What a sim cluster reached over SSH needs: root with `ip netns`, sshd, ssh, rsync, terraform."""
    if not netns_available():
        skip_or_fail("needs root and `ip netns`")
    require_ssh()
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform on PATH")


def ssh_sim_toml(name: str, nodes: int, octet: int, extra: str = "") -> str:
    """A 1g netns sim cluster whose nodes are reached over SSH, on 10.<octet>.0.0/24."""
    return f"""\
[clusters.{name}]
provider = "sim"
nodes = {nodes}
tier = "1g"
isolation = "netns"
transport = "ssh"
private_cidr = "10.{octet}.0.0/24"
rdzv_port = {free_port()}
{extra}"""


@pytest.fixture
def sshd(needs_ssh, tmp_path_factory, monkeypatch):
    """A private sshd on 127.0.0.1 and an ssh config that reaches it; yields the config path."""
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
    if not wait_for_port(port, proc, timeout_s=10):
        pytest.fail("sshd did not start: " + (base / "sshd.log").read_text())
    yield base
    proc.terminate()
    proc.wait(10)
    # The multiplexing masters (ControlPersist) of this test's connections outlive sshd's listener.
    for sock in (base / "cm").glob("*"):
        subprocess.run(["ssh", "-F", str(base / "ssh_config"), "-o", f"ControlPath={sock}", "-O", "exit",
                        "127.0.0.1"], capture_output=True, timeout=10)


def ssh_outputs(rdzv_port: int) -> dict:
    # Machines reached over SSH that fatpipe did not make (an AWS node is reached only with the
    # key its console shows: ops/reach/hostkeys.py).
    return {
        "name": "demo", "provider": "ssh", "region": "ssh", "tier_gbps": 10,
        "private_cidr": "10.42.0.0/24", "rdzv_port": rdzv_port,
        "nodes": [{"name": f"demo-{i}", "public_ip": "127.0.0.1", "private_ip": f"127.0.0.{10 + i}",
                   "transport": "ssh"} for i in range(2)],
    }


# -- Terraform with the real hashicorp/aws provider, from a filesystem mirror (no registry) --------

PLUGIN_DIR_ENV = "FATPIPE_TF_PLUGIN_DIR"  # a folder holding registry.terraform.io/hashicorp/aws/...
# Where Terraform itself looks for an unpacked mirror when no CLI config names one.
IMPLIED_MIRRORS = ("~/.terraform.d/plugins", "~/.local/share/terraform/plugins",
                   "/usr/local/share/terraform/plugins", "/usr/share/terraform/plugins")


@dataclass(frozen=True)
class AwsMirror:
    """The mirror, the provider version it holds, and the environment that makes terraform use it."""

    plugin_dir: Path
    version: str
    env: dict

    def pin(self, stack_dir: Path) -> None:
        """Pin hashicorp/aws to the mirror's version in this scratch stack folder (an override file)."""
        pin = {"terraform": {"required_providers": {"aws": {
            "source": "registry.terraform.io/hashicorp/aws", "version": self.version}}}}
        (stack_dir / "mirror_version_override.tf.json").write_text(json.dumps(pin))


def find_aws_mirror() -> Path | None:
    candidates = [os.environ.get(PLUGIN_DIR_ENV)] + [os.path.expanduser(p) for p in IMPLIED_MIRRORS]
    for base in filter(None, candidates):
        if any(Path(base).glob("registry.terraform.io/hashicorp/aws/*/linux_amd64/terraform-provider-aws_*")):
            return Path(base)
    return None


@pytest.fixture(scope="session")
def aws_mirror(tmp_path_factory) -> AwsMirror:
    if not shutil.which("terraform"):
        skip_or_fail("terraform not found")
    base = find_aws_mirror()
    if base is None:
        skip_or_fail(f"no hashicorp/aws provider mirror (set {PLUGIN_DIR_ENV} to the folder holding "
                     "registry.terraform.io/hashicorp/aws/<version>/linux_amd64/)")
    version = sorted(p.name for p in (base / "registry.terraform.io/hashicorp/aws").iterdir())[-1]
    config = tmp_path_factory.mktemp("tf") / "terraform.rc"
    config.write_text(f"""\
provider_installation {{
  filesystem_mirror {{
    path    = "{base}"
    include = ["registry.terraform.io/hashicorp/aws"]
  }}
  direct {{
    exclude = ["registry.terraform.io/hashicorp/aws"]
  }}
}}
disable_checkpoint = true
""")
    print(f"terraform uses hashicorp/aws {version} from the mirror {base}; scratch stacks are pinned to it")
    return AwsMirror(base, version, {"TF_CLI_CONFIG_FILE": str(config), "CHECKPOINT_DISABLE": "1"})


def terraform(args: list[str], cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run terraform in `cwd`; the result carries the output for assertion messages."""
    return subprocess.run(["terraform", *args, "-no-color"], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)


def fatpipe_cli(folder: Path, *args: str, control_dir: str, timeout: float = 600,
                columns: int = 200) -> subprocess.CompletedProcess:
    """`fatpipe ARGS` in `folder` as a user runs it, output and errors together. ssh's
    multiplexing sockets need a short path (108 bytes), so `control_dir` is not below pytest's."""
    env = {**os.environ, "COLUMNS": str(columns), "FATPIPE_SSH_CONTROL_DIR": control_dir}
    env.pop("FATPIPE_CONFIG", None)
    env.pop("FATPIPE_REMOTE_DIR", None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def declared_env_cli(folder: Path, *args: str, control_dir: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`fatpipe ARGS` whose nodes get the environment the project declares: the suite's own
    FATPIPE_TORCH overrides (this machine's torch for every node) are left out."""
    import faults

    env = faults.cli_env(FATPIPE_SSH_CONTROL_DIR=control_dir)
    for name in ("FATPIPE_TORCH", "FATPIPE_TORCH_INDEX_URL"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def rented_sim_toml(folder: Path, hosts: str, rented: str, octet: int, remote_dirs: list[str], *,
                    rdzv_port: int, sim_extra: str = "") -> str:
    """A sim cluster `hosts` reached over SSH (bare machines with sshd) and the same machines
    declared as an `ssh` cluster `rented`, as a user declares VPS rented anywhere."""
    host_tables = "\n".join(
        f'[[clusters.{rented}.hosts]]\naddress = "10.{octet}.0.{10 + i}"\nprivate_ip = "10.{octet}.0.{10 + i}"\n'
        f'remote_dir = "{remote}"\n' for i, remote in enumerate(remote_dirs))
    return f"""\
[clusters.{hosts}]
provider = "sim"
nodes = {len(remote_dirs)}
tier = "1g"
isolation = "netns"
transport = "ssh"
{sim_extra}private_cidr = "10.{octet}.0.0/24"

[clusters.{rented}]
provider = "ssh"
tier = "1g"
ssh_user = "root"
ssh_key_file = "{folder}/.fatpipe/{hosts}/ssh/id_ed25519"
install_packages = false    # these share this machine's packages
private_cidr = "10.{octet}.0.0/24"
rdzv_port = {rdzv_port}

{host_tables}
"""


# A process that accepts TCP connections on every port given (a stand-in for the rendezvous store
# and gloo's listeners, whose reachability the firewall tests probe).
PORT_LISTENER = """\
import socket, sys, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        s.accept()[0].close()
for port in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(port),), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""
