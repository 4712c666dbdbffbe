"""Host values of an ssh cluster never run as commands, here or on the node (real terraform, sshd).

Hostile values in every field of an `ssh` cluster: those fatpipe refuses fail `config` and
`deploy` with one line naming the field; the ones it accepts (a key path, a remote folder) go
through `synth`, `deploy` and `down` with real terraform against a machine with sshd (a sim node
over SSH, as test_ssh_provider uses), and marker files prove no `$(...)`, backtick or `;` ran.
The applier reaches the node on stdin: an sshd whose /tmp is read-only still runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import SSHD, free_port, wait_for_port

HOSTS, RENTED = "hvhosts", "hvrented"
OCTET = 173  # a sim network of this test's own
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-hv-cm-")  # short: a socket path must fit in 108 bytes
MARK = f"fp-hv-mark-{os.getpid()}"


def payloads(n: int) -> str:
    """A `$(...)`, a backtick and a `;` command, each of which would leave a marker file."""
    return f"$(touch {MARK}-{n}a) `touch {MARK}-{n}b`; touch {MARK}-{n}c"


def markers(*folders: Path) -> list[str]:
    return [str(p) for folder in folders for p in Path(folder).glob(f"{MARK}-*")]


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "160", "FATPIPE_SSH_CONTROL_DIR": CONTROL_DIR}
    env.pop("FATPIPE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string for these characters


def write_project(folder: Path, host: dict, cluster: dict) -> None:
    host = {"address": f"10.{OCTET}.0.10", "private_ip": f"10.{OCTET}.0.10", **host}
    cluster = {"ssh_user": "root", **cluster}
    (folder / "fatpipe.toml").write_text(f"""\
[clusters.{HOSTS}]          # the "rented" machine: a sim node with sshd
provider = "sim"
nodes = 1
tier = "1g"
isolation = "netns"
transport = "ssh"
private_cidr = "10.{OCTET}.0.0/24"

[clusters.{RENTED}]
provider = "ssh"
tier = "1g"
install_packages = false
private_cidr = "10.{OCTET}.0.0/24"
{chr(10).join(f"{k} = {toml_string(v)}" for k, v in cluster.items())}

[[clusters.{RENTED}.hosts]]
{chr(10).join(f"{k} = {toml_string(v)}" for k, v in host.items())}
""")


@pytest.mark.parametrize("where,key,value", [
    ("host", "address", payloads(1)),
    ("host", "address", f"-oProxyCommand=touch {MARK}-1d"),
    ("host", "name", payloads(2)),
    ("host", "user", payloads(3)),
    ("cluster", "ssh_user", f"-oProxyCommand=touch {MARK}-3d"),
])
def test_a_hostile_address_login_or_name_is_refused_before_anything_runs(tmp_path, where, key, value):
    write_project(tmp_path, {key: value} if where == "host" else {},
                  {key: value} if where == "cluster" else {"ssh_key_file": str(tmp_path / "no-key")})
    for command in (["config", RENTED], ["synth", RENTED], ["deploy", RENTED, "--yes"]):
        done = fatpipe(tmp_path, *command, timeout=300)
        problems = [line for line in done.stdout.splitlines() if f"clusters.{RENTED}" in line]
        assert done.returncode == 2 and len(problems) == 1 and key in problems[0], done.stdout
    assert markers(tmp_path, Path.home()) == []


@pytest.fixture
def rented_machine(needs_netns, needs_ssh, tmp_path):
    """One sim node with sshd; removed afterwards whatever happened."""
    write_project(tmp_path, {}, {})
    deployed = fatpipe(tmp_path, "deploy", HOSTS)
    assert deployed.returncode == 0, deployed.stdout
    try:
        yield tmp_path
    finally:
        fatpipe(tmp_path, "down", RENTED, timeout=300)
        down = fatpipe(tmp_path, "down", HOSTS, timeout=300)
        assert down.returncode == 0, down.stdout


def test_accepted_hostile_values_are_inert_through_deploy_and_down(rented_machine):
    folder = rented_machine
    node_root = folder / ".fatpipe" / HOSTS / "nodes" / f"{HOSTS}-0" / "root"
    # The node's key, at a path full of shell syntax and spaces: it must work, and run nothing.
    key = folder / "keys" / payloads(4) / f"my key {payloads(5)}"
    key.parent.mkdir(parents=True)
    shutil.copy2(folder / ".fatpipe" / HOSTS / "ssh" / "id_ed25519", key)
    host = {"remote_dir": f"fatpipe/{payloads(6)}"}
    write_project(folder, host, {"ssh_key_file": str(key)})
    config = fatpipe(folder, "config", RENTED)
    if config.returncode != 0:  # refusing the remote folder is the other safe answer
        problems = [line for line in config.stdout.splitlines() if f"clusters.{RENTED}" in line]
        assert len(problems) == 1 and "remote_dir" in problems[0], config.stdout
        write_project(folder, {}, {"ssh_key_file": str(key)})
        config = fatpipe(folder, "config", RENTED)
    assert config.returncode == 0, config.stdout

    synth = fatpipe(folder, "synth", RENTED)
    assert synth.returncode == 0, synth.stdout
    deploy = fatpipe(folder, "deploy", RENTED, "--yes", timeout=600)
    assert markers(folder, Path.home(), node_root) == [], deploy.stdout
    assert deploy.returncode == 0, deploy.stdout
    assert (node_root / "var" / "lib" / "fatpipe" / "restore.json").exists()  # applied over SSH with that key
    down = fatpipe(folder, "down", RENTED, timeout=300)
    assert markers(folder, Path.home(), node_root, Path.cwd()) == [], down.stdout
    assert down.returncode == 0, down.stdout
    assert not (node_root / "var" / "lib" / "fatpipe").exists()

    stack = json.loads((folder / "cdktf.out" / "stacks" / RENTED / "cdk.tf.json").read_text())
    for resource in stack["resource"]["terraform_data"].values():
        for provisioner in resource["provisioner"]:
            run = provisioner["local-exec"]
            # A constant command, run without a shell; the host arrives as environment.
            assert run["command"] in ("apply", "revert") and run["interpreter"][1:] == ["-m", "fatpipe.cli", "ssh-node"]
            assert run["environment"]["FATPIPE_HOST_KEY_FILE"] == "${self.input.key_file}"


@pytest.fixture
def sshd_with_readonly_tmp(sshd, tmp_path):
    """The sshd fixture's keys served by a second sshd in a mount namespace whose /tmp is read-only."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (util-linux) for a read-only /tmp")
    port = free_port()
    config = sshd / "sshd_config"
    text = config.read_text().replace("Port ", f"Port {port}\n#").replace(
        f"PidFile {sshd / 'sshd.pid'}", "PidFile none")
    (sshd / "sshd_ro_config").write_text(text)
    mount = f"mount --rbind /tmp /tmp && mount -o remount,bind,ro /tmp && exec {SSHD} -D -e -f {sshd / 'sshd_ro_config'}"
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sshd_ro.log", "w"))
    try:
        if not wait_for_port(port, proc, timeout_s=20):
            pytest.fail("read-only-/tmp sshd did not start: " + (tmp_path / "sshd_ro.log").read_text())
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_applier_reaches_the_node_on_stdin_not_through_tmp(sshd_with_readonly_tmp, tmp_path):
    from fatpipe.ops.reach.profile import SshHost, run_agent

    host = SshHost("ro-0", "127.0.0.1", sshd_with_readonly_tmp, user="root")  # the key: FATPIPE_SSH_CONFIG
    # Nothing recorded on this machine, so revert changes nothing; it must still run the applier.
    assert not Path("/var/lib/fatpipe/restore.json").exists()
    probe = subprocess.run(["ssh", "-F", os.environ["FATPIPE_SSH_CONFIG"], "-p", str(sshd_with_readonly_tmp),
                            "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={tmp_path / 'kh0'}",
                            "127.0.0.1", "touch /tmp/fp-hv-probe"], capture_output=True, text=True, timeout=60)
    assert "Read-only file system" in probe.stderr, probe  # the node's /tmp takes no file
    done = run_agent(host, "revert", {"unit": "fatpipe-hv-test.service", "remove": []}, tmp_path / "known_hosts")
    assert done == {"reverted": False}
