"""The `ssh` provider without machines: its cluster file, the applier's command, its error lines."""

from __future__ import annotations

import pytest

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.project import parse_project
from fatpipe.ops.reach.profile import SshHost, agent_command, agent_program, explain
from fatpipe.ops.reach.transport import Result

HOSTS = """
[[clusters.r.hosts]]
address = "203.0.113.10"
private_ip = "10.0.0.10"
[[clusters.r.hosts]]
address = "vps2.example.net"
port = 2222
user = "ubuntu"
private_ip = "10.0.0.11"
"""


def cluster(extra: str = "", hosts: str = HOSTS):
    return parse_project(f'[clusters.r]\nprovider = "ssh"\ntier = "1g"\n{extra}\n{hosts}', "fatpipe.toml").clusters["r"]


def test_hosts_make_the_nodes_and_the_network():
    c = cluster()
    assert c.nodes == 2 and [c.node_name(i) for i in range(2)] == ["r-0", "r-1"]
    assert c.private_cidr is None and c.node_network == "10.0.0.8/30" and c.private_ip(1) == "10.0.0.11"
    assert c.hosts[1].port == 2222 and c.hosts[1].user == "ubuntu" and c.ssh_user == "root"
    assert cluster('private_cidr = "10.0.0.0/24"').private_cidr == "10.0.0.0/24"


@pytest.mark.parametrize("extra,hosts,message", [
    ("", HOSTS.replace("10.0.0.11", "10.0.0.10"), "repeats 10.0.0.10"),
    ("", HOSTS.replace('"vps2.example.net"\nport = 2222', '"203.0.113.10"\nport = 22'), "repeats 203.0.113.10:22"),
    ('private_cidr = "10.9.0.0/24"', HOSTS, "outside private_cidr 10.9.0.0/24"),
    ("", HOSTS.replace("port = 2222", "port = 70000"), "less than or equal to 65535"),
    ("", HOSTS.replace('"10.0.0.11"', '"fe80::1"'), "not an IPv4 address"),
    ("nodes = 3", HOSTS, "2 hosts are listed"),
    ("", "", "hosts: required but missing"),
])
def test_bad_ssh_clusters_are_one_line_naming_the_key(extra, hosts, message):
    with pytest.raises(ConfigError) as e:
        cluster(extra, hosts)
    problems = [line for line in str(e.value).splitlines() if "clusters.r" in line]
    assert len(problems) == 1 and message in problems[0], str(e.value)  # that one, no follow-on noise


def test_the_applier_travels_whole_on_stdin_and_runs_as_root():
    profile = {"files": {}, "sysctls": {"net.ipv4.tcp_rmem": "4096 131072 8388608"}, "unit": "u"}
    program = agent_program(profile)
    assert program.rstrip().endswith("main()") and 'net.ipv4.tcp_rmem' in program
    compile(program, "agent", "exec")  # one valid program
    # The command reads it from stdin: nothing lands in a file on the node (no /tmp path to swap).
    assert agent_command("apply", as_root=False) == "sudo -n python3 - apply"
    assert agent_command("revert", as_root=True) == "python3 - revert"


@pytest.mark.parametrize("stderr,code,words", [
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.", 255, "host key changed"),
    ("sudo: a password is required", 1, "no passwordless sudo"),
    ("ssh: connect to host 10.0.0.10 port 22: Connection refused", 255, "does not answer over SSH"),
    ("fatpipe: the node profile needs root", 1, "needs root"),
])
def test_failures_name_what_to_do(stderr, code, words):
    assert words in explain(Result(code, "", stderr))
    assert SshHost("r-0", "10.0.0.10").where() == "r-0 (root@10.0.0.10:22)"
