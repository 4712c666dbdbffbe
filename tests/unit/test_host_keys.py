"""Host-key policies without a network: the console's key block read, the ssh options each
policy gives, the keys of recreated nodes forgotten (real ssh -G and ssh-keygen on files)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fatpipe.infra.outputs import parse_outputs
from fatpipe.ops.reach.hostkeys import (
    console_keys,
    forget_recreated,
    known_hosts_options,
    policy_for,
)

ED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOQ3bP3hG0f7Wl3R8oK5k1JtY5t9kqvWq2m6f2QyZ0aB"
ECDSA = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEz0aQ=="
BLOCK = "-----BEGIN SSH HOST KEY KEYS-----\n{}\n-----END SSH HOST KEY KEYS-----\n"


@pytest.mark.parametrize("text,keys", [
    ("Linux version 6.8\n" + BLOCK.format(f"{ECDSA} root@ip-10-0-0-1\n{ED} root@ip-10-0-0-1"), [ECDSA, ED]),
    # CRLF, and a prefix before each line (a timestamp, cloud-init's tag)
    (BLOCK.format(f"[   12.3] {ED} root@h\r").replace("\n", "\r\n"), [ED]),
    (BLOCK.format(f"ec2: {ED}"), [ED]),
    # A reboot prints another block: the last one counts
    (BLOCK.format(f"{ECDSA} old") + "reboot\n" + BLOCK.format(f"{ED} new"), [ED]),
    # Fingerprints are not keys; a block not yet closed is not a block
    ("-----BEGIN SSH HOST KEY FINGERPRINTS-----\n256 SHA256:abc root@h (ED25519)\n"
     "-----END SSH HOST KEY FINGERPRINTS-----\n", []),
    ("-----BEGIN SSH HOST KEY KEYS-----\n" + ED + "\n", []),
    ("", []), (None, []),
    # Junk inside the block is skipped, never written to known_hosts
    (BLOCK.format(f"@cert-authority * {ED}\nssh-ed25519 short\nrm -rf / ssh-rsa\n{ED}"), [ED]),
])
def test_the_console_block_gives_exactly_its_keys(text, keys):
    assert console_keys(text) == keys


def test_each_provider_has_its_policy():
    assert policy_for("aws") == "pinned" and policy_for("ssh") == "user"
    assert policy_for("digitalocean") == policy_for("sim") == policy_for("vm") == "accept-new"


def options(policy, tmp_path, config, port=2222):
    opts = known_hosts_options(policy, tmp_path / "cluster known_hosts", str(config), "h1.example", port)
    return dict(o.split("=", 1) for o in opts[1::2])


def test_the_options_each_policy_gives(tmp_path):
    user_file = tmp_path / "mine"
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  UserKnownHostsFile {user_file}\n")
    cluster = f'"{tmp_path / "cluster known_hosts"}"'
    assert options("accept-new", tmp_path, config) == {"StrictHostKeyChecking": "accept-new", "UserKnownHostsFile": cluster}
    assert options("pinned", tmp_path, config) == {"StrictHostKeyChecking": "yes", "UserKnownHostsFile": cluster}
    # A host the user's file does not know: first contact, written to the cluster's file only.
    assert options("user", tmp_path, config) == {"StrictHostKeyChecking": "accept-new", "UserKnownHostsFile": cluster}
    user_file.write_text(f"[h1.example]:2222 {ED}\n")
    assert options("user", tmp_path, config) == {"StrictHostKeyChecking": "yes", "UserKnownHostsFile": str(user_file)}
    assert options("user", tmp_path, config, port=22)["UserKnownHostsFile"] == cluster  # another port, another host
    subprocess.run(["ssh-keygen", "-H", "-f", str(user_file)], check=True, capture_output=True)  # hashed names
    assert options("user", tmp_path, config)["StrictHostKeyChecking"] == "yes"


def outputs(nodes):
    return parse_outputs({"name": "do", "provider": "digitalocean", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
                          "nodes": [{"name": n, "public_ip": ip, "instance_id": i, "private_ip": f"10.42.0.{10 + k}",
                                     "transport": "ssh"} for k, (n, ip, i) in enumerate(nodes)]})


def test_deploy_forgets_the_keys_of_the_nodes_it_recreated_and_no_others(tmp_path, monkeypatch):
    monkeypatch.setenv("FATPIPE_SSH_CONFIG", "/dev/null")
    known = tmp_path / "known_hosts"
    lines = {"203.0.113.5": ED, "203.0.113.6": ECDSA, "203.0.113.7": ED, "198.51.100.9": ED}
    known.write_text("".join(f"{host} {key}\n" for host, key in lines.items()))
    before = outputs([("do-0", "203.0.113.5", "101"), ("do-1", "203.0.113.6", "102"), ("do-2", "203.0.113.7", "103")])
    after = outputs([("do-0", "203.0.113.5", "201"),  # recreated at the same address
                     ("do-1", "203.0.113.6", "102"),  # untouched
                     ("do-2", "203.0.113.8", "203")])  # recreated elsewhere
    assert forget_recreated(known, before, after) == ["do-0", "do-2"]
    kept = [line.split()[0] for line in known.read_text().splitlines()]
    assert kept == ["203.0.113.6", "198.51.100.9"] and not Path(f"{known}.old").exists()
    assert forget_recreated(known, None, after) == []  # a first deploy forgets nothing


def test_aws_user_data_leaves_the_host_keys_on_the_console(tmp_path):
    # cloud-init prints them unless told not to (ssh.emit_keys_to_console, ssh_key_console_blacklist).
    from fatpipe.infra.project import parse_project
    from fatpipe.stacks.providers import provider_for

    key = tmp_path / "id.pub"
    key.write_text(f"{ED} me\n")
    project = parse_project(f'[clusters.a]\nprovider = "aws"\nregion = "us-east-1"\nssh_cidr = "203.0.113.7/32"\n'
                            f'ssh_public_key = "{key}"\n', "fatpipe.toml")
    doc = json.loads(provider_for("aws").user_data(project.clusters["a"]).split("\n", 1)[1])
    assert doc.get("ssh", {}).get("emit_keys_to_console", True) is True
    assert not {"ssh-ed25519", "ecdsa-sha2-nistp256"} & set(doc.get("ssh_key_console_blacklist", []))
