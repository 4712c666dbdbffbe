"""Host keys against a real sshd: a key in the user's own known_hosts is enforced for an `ssh`
cluster, and an AWS node's keys are pinned from its console before the first connection.

The console is moto's GetConsoleOutput through boto3, as fatpipe calls it. moto answers every
instance with one fixed text (a 2006 Xen boot log, no keys), so the tests that need keys put
the sshd's key block into that text, and only that: the API call, the parsing, the pinning and
the ssh connection are real. The user's files are named by the test's own ssh config
(FATPIPE_SSH_CONFIG), so the real ~/.ssh is never read or written.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.outputs import parse_outputs
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.reach.hostkeys import pin_cluster_keys
from fatpipe.ops.reach.transport import transports_for
from fatpipe.stacks.providers import provider_for

CONSOLE = ("[    9.1] cloud-init[812]: Cloud-init v. 24.4 finished\n"
           "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\nec2: 256 SHA256:x root@ip (ED25519)\n"
           "ec2: -----END SSH HOST KEY FINGERPRINTS-----\n"
           "-----BEGIN SSH HOST KEY KEYS-----\n{keys}\n-----END SSH HOST KEY KEYS-----\n")


def sshd_port(sshd: Path) -> int:
    return int(next(line.split()[1] for line in (sshd / "sshd_config").read_text().splitlines() if line.startswith("Port ")))


def outputs(provider: str, port: int, instance_id: str | None = None):
    node = {"name": f"{provider}-0", "public_ip": "127.0.0.1", "ssh_port": port, "private_ip": "10.42.0.10",
            "transport": "ssh", "instance_id": instance_id}
    return parse_outputs({"name": "keys", "provider": provider, "region": "us-east-1", "tier_gbps": 1,
                          "private_cidr": "10.42.0.0/24", "nodes": [node]})


def project(tmp_path: Path):
    return SimpleNamespace(state_dir=lambda name: tmp_path / ".fatpipe" / name)


def run(tmp_path: Path, out):
    """`echo` on the node through the transport fatpipe builds, in a fresh multiplexing folder
    (a master left from an earlier step would skip the key check; a socket path must be short)."""
    control = tempfile.mkdtemp(prefix="fp-hk-")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("FATPIPE_SSH_CONTROL_DIR", control)
            [transport] = transports_for(out, project(tmp_path).state_dir(out.name))
            return transport.run("echo reached", timeout=60)
    finally:
        for sock in Path(control).glob("*"):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=30)
        shutil.rmtree(control, ignore_errors=True)


def other_key(tmp_path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    return " ".join((tmp_path / "other.pub").read_text().split()[:2])


def real_key(sshd: Path) -> str:
    return " ".join((sshd / "host_key.pub").read_text().split()[:2])


def test_an_ssh_cluster_enforces_the_key_in_the_users_own_known_hosts(sshd, tmp_path):
    port, mine = sshd_port(sshd), tmp_path / "my_known_hosts"
    config = sshd / "ssh_config"
    config.write_text(config.read_text() + f"  UserKnownHostsFile {mine}\n")
    out = outputs("ssh", port)
    mine.write_text(f"[127.0.0.1]:{port} {other_key(tmp_path)}\n")  # the user verified another key
    refused = run(tmp_path, out)
    assert not refused.ok and "reached" not in refused.stdout, refused
    assert "host key" in refused.stderr.lower() or "identification has changed" in refused.stderr.lower(), refused.stderr
    mine.write_text(f"[127.0.0.1]:{port} {real_key(sshd)}\n")
    reached = run(tmp_path, out)
    assert reached.ok and "reached" in reached.stdout, reached
    cluster_file = tmp_path / ".fatpipe" / "keys" / "known_hosts"
    assert not cluster_file.exists() or "127.0.0.1" not in cluster_file.read_text()
    assert mine.read_text() == f"[127.0.0.1]:{port} {real_key(sshd)}\n"  # never written by fatpipe


@pytest.fixture
def ec2_instance(monkeypatch):
    """An instance in moto (in this process), and a way to set what its console prints."""
    import boto3
    import moto.ec2.responses.general as general
    from moto import mock_aws

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        image = ec2.describe_images()["Images"][0]["ImageId"]
        instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        yield instance, lambda text: monkeypatch.setattr(general, "SAMPLE_CONSOLE_OUTPUT", text)


def test_an_aws_node_is_reached_only_with_the_key_its_console_shows(sshd, tmp_path, ec2_instance):
    instance, console = ec2_instance
    out, aws = outputs("aws", sshd_port(sshd), instance), provider_for("aws")
    console(CONSOLE.format(keys=f"{real_key(sshd)} root@ip-10-42-0-10"))
    assert pin_cluster_keys(Cluster(project(tmp_path), outputs=out), aws.console_output) == ["aws-0"]
    reached = run(tmp_path, out)
    assert reached.ok and "reached" in reached.stdout, reached
    assert pin_cluster_keys(Cluster(project(tmp_path), outputs=out), aws.console_output) == []  # known: not read again


def test_an_aws_node_showing_another_key_than_its_console_is_refused(sshd, tmp_path, ec2_instance):
    instance, console = ec2_instance
    out = outputs("aws", sshd_port(sshd), instance)
    console(CONSOLE.format(keys=f"{other_key(tmp_path)} root@ip-10-42-0-10"))  # a machine in the middle
    pin_cluster_keys(Cluster(project(tmp_path), outputs=out), provider_for("aws").console_output)
    refused = run(tmp_path, out)
    assert not refused.ok and "reached" not in refused.stdout, refused
    assert "host key" in refused.stderr.lower() or "identification has changed" in refused.stderr.lower(), refused.stderr
    known = (tmp_path / ".fatpipe" / "keys" / "known_hosts").read_text()
    assert real_key(sshd) not in known  # nothing accepted on first contact


def test_an_aws_node_whose_console_has_no_keys_is_reported_and_never_reached(sshd, tmp_path, ec2_instance):
    instance, _ = ec2_instance  # moto's own console text: a boot log without keys
    out = outputs("aws", sshd_port(sshd), instance)
    with pytest.raises(FatpipeError) as e:
        pin_cluster_keys(Cluster(project(tmp_path), outputs=out), provider_for("aws").console_output, timeout_s=1)
    assert "aws-0" in str(e.value) and "host keys" in str(e.value) and "\n" not in str(e.value)
    refused = run(tmp_path, out)
    assert not refused.ok and "reached" not in refused.stdout, refused
