"""The host firewall without machines: the cluster keys, the rules rendered, the listings judged."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fatpipe.cli.main import cli as main
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.firewall import trust_summary
from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import parse_project
from fatpipe.node import hostfirewall
from fatpipe.node.hostfirewall import iptables_rules, nft_ruleset, normal_save
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.reach.firewall_check import listing_problem, require_firewall
from fatpipe.ops.reach.profile import agent_program
from fatpipe.stacks.node_profile import profile_plan


def ssh_cluster(ips=("10.0.0.10", "10.0.0.11"), extra: str = ""):
    hosts = "".join(f'[[clusters.r.hosts]]\naddress = "h{i}"\nprivate_ip = "{ip}"\n' for i, ip in enumerate(ips))
    return parse_project(f'[clusters.r]\nprovider = "ssh"\n{extra}\n{hosts}', "fatpipe.toml").clusters["r"]


def test_the_firewall_is_on_by_default_and_trusts_the_nodes_or_the_declared_network():
    c = ssh_cluster()
    assert c.firewall is True and c.public_private_ips is False
    nodes = ["10.0.0.10/32", "10.0.0.11/32"]
    assert profile_plan(c, None, {})["firewall"] == {"trusted": nodes, "members": nodes, "run_ports": [29400, 29405]}
    declared = ssh_cluster(extra='private_cidr = "10.0.0.0/24"\nrdzv_port = 31000')
    assert profile_plan(declared, None, {})["firewall"] == {"trusted": ["10.0.0.0/24"], "members": nodes,
                                                            "run_ports": [31000, 31005]}
    assert profile_plan(ssh_cluster(extra="firewall = false"), None, {})["firewall"] is None
    sim = parse_project('[clusters.s]\nprovider = "sim"\ntransport = "ssh"\n', "f.toml").clusters["s"]
    assert sim.firewall and profile_plan(sim, None, {})["firewall"]["trusted"] == ["10.42.0.0/24"]
    assert profile_plan(sim, None, {})["firewall"]["members"] == [f"10.42.0.{10 + i}/32" for i in range(sim.nodes)]


@pytest.mark.parametrize("ips", [("100.64.3.1", "100.64.3.2"), ("172.20.0.5", "172.20.0.6"),
                                 ("192.168.7.1", "192.168.7.2")])
def test_rfc1918_and_shared_space_are_private(ips):
    assert ssh_cluster(ips).node_network


@pytest.mark.parametrize("ips,extra,key", [
    (("203.0.113.10", "203.0.113.11"), "", "hosts[0].private_ip 203.0.113.10"),
    (("10.0.0.10", "8.8.8.8"), "", "hosts[1].private_ip 8.8.8.8"),
    (("169.254.0.10", "169.254.0.11"), "", "hosts[0].private_ip 169.254.0.10"),
    # Each node finds its private NIC in the network holding them all: over both, the world.
    (("10.0.0.10", "192.168.0.10"), "", "the network holding every private_ip, 0.0.0.0/0"),
])
def test_a_public_private_ip_is_refused_in_one_line_with_the_reason(ips, extra, key):
    with pytest.raises(ConfigError) as e:
        ssh_cluster(ips, extra)
    text = str(e.value)
    assert "\n" not in text and key in text and "outside the private ranges" in text
    assert "public_private_ips = true" in text and "rendezvous" in text


@pytest.mark.parametrize("ips", [
    ("10.0.0.5", "10.200.1.7"),  # the network holding both is 10.0.0.0/8: a provider's other tenants
    ("100.64.3.1", "100.127.250.9"),  # a tailnet's other devices
    ("172.16.0.2", "172.31.255.254", "172.20.9.9"),
    ("192.168.1.10",),
])
def test_without_private_cidr_the_firewall_trusts_each_node_and_no_computed_network(ips):
    c = ssh_cluster(ips)
    trusted = profile_plan(c, None, {})["firewall"]["trusted"]
    assert trusted == [f"{ip}/32" for ip in ips]
    assert c.private_cidr is None  # nothing derived stands for a declared network
    text = nft_ruleset(trusted, [22])
    assert f"ip saddr {{ {', '.join(trusted)} }} accept" in text and "/8" not in text
    summary = trust_summary(c)
    assert all(t in summary for t in trusted) and "private_cidr" in summary and "\n" not in summary


def test_the_profile_finds_the_nic_in_the_network_holding_the_nodes():
    # Not a trust decision: where the net script looks for the private NIC (unchanged).
    files = profile_plan(ssh_cluster(("10.0.0.5", "10.200.1.7")), None, {})["files"]
    assert "CIDR=10.0.0.0/8" in files["/usr/local/sbin/fatpipe-net"]["content"]


def test_config_says_what_the_firewall_trusts(tmp_path):
    hosts = "".join(f'[[clusters.r.hosts]]\naddress = "h{i}"\nprivate_ip = "{ip}"\n'
                    for i, ip in enumerate(("10.0.0.5", "10.200.1.7")))
    (tmp_path / "fatpipe.toml").write_text(f'[clusters.r]\nprovider = "ssh"\n{hosts}'
                                           '[clusters.s]\nprovider = "sim"\ntransport = "ssh"\nprivate_cidr = "10.217.0.0/24"\n'
                                           '[clusters.n]\nprovider = "sim"\nprivate_cidr = "10.218.0.0/24"\n')
    doc = json.loads(CliRunner().invoke(main, ["--config", str(tmp_path / "fatpipe.toml"), "config", "--json"]).output)
    trusts = {name: c.get("firewall_trusts") for name, c in doc["clusters"].items()}
    assert trusts["r"]["sources"] == ["10.0.0.5/32", "10.200.1.7/32"] and "own address" in trusts["r"]["summary"]
    assert trusts["s"]["sources"] == ["10.217.0.0/24"]  # the network fatpipe makes for its sim nodes
    assert trusts["n"] is None  # netns sim nodes get no host firewall
    table = CliRunner().invoke(main, ["--config", str(tmp_path / "fatpipe.toml"), "config", "r"],
                               env={"COLUMNS": "250"}).output
    assert "10.0.0.5/32, 10.200.1.7/32" in table


@pytest.mark.parametrize("ip, said", [("0.0.0.0", "every interface"), ("224.0.0.1", "multicast"),
                                      ("255.255.255.255", "broadcast")])
def test_public_private_ips_still_wants_one_machines_address(ip, said):
    with pytest.raises(ConfigError) as e:
        ssh_cluster((ip, "203.0.113.11"), "public_private_ips = true")
    assert said in str(e.value) and "hosts.0.private_ip" in str(e.value) and "\n" not in str(e.value)


def test_public_private_ips_trusts_only_the_nodes_themselves():
    c = ssh_cluster(("203.0.113.10", "203.0.113.11"), "public_private_ips = true")
    assert profile_plan(c, None, {})["firewall"]["trusted"] == ["203.0.113.10/32", "203.0.113.11/32"]


def test_the_nft_table_drops_all_but_ssh_from_outside():
    text = nft_ruleset(["10.9.0.0/24"], [2222, 22, 22])
    assert text.startswith("table inet fatpipe {") and "hook input priority 0; policy drop;" in text
    assert 'iif "lo" accept' in text and "ct state established,related accept" in text
    assert "ip saddr { 10.9.0.0/24 } accept" in text and "tcp dport { 22, 2222 } accept" in text
    assert "29400" not in text  # the rendezvous port is reachable from the trusted network only


def test_the_iptables_chain_ends_in_drop_and_trusts_ipv4_only():
    v4 = iptables_rules(["10.9.0.0/24"], [22], v6=False)
    v6 = iptables_rules(["10.9.0.0/24"], [22], v6=True)
    assert v4[0] == ["-i", "lo", "-j", "ACCEPT"] and v4[-1] == ["-j", "DROP"] and v6[-1] == ["-j", "DROP"]
    assert ["-s", "10.9.0.0/24", "-j", "ACCEPT"] in v4 and not any("-s" in r for r in v6)
    assert ["-p", "tcp", "--dport", "22", "-j", "ACCEPT"] in v6


def test_a_declared_network_reaches_every_port_but_the_runs_which_only_the_nodes_reach(monkeypatch):
    # The Lighthouse (kill), the Manager (Kill RPC), the checkpoint server (the weights) and the
    # store (unpickles): the nodes' own addresses reach them, not the rest of private_cidr.
    c = ssh_cluster(extra='private_cidr = "10.0.0.0/24"\nrdzv_port = 50000')
    plan = profile_plan(c, None, {})["firewall"]
    monkeypatch.setattr(hostfirewall, "ephemeral_ports", lambda: [32768, 60999])
    guarded = hostfirewall.guarded_ports(plan)
    assert guarded == [[32768, 60999]]  # rdzv_port's 50000-50005 lies in the ephemeral range: one range
    text = nft_ruleset(plan["trusted"], [22], plan["members"], guarded).splitlines()
    nodes = text.index('\t\tip saddr { 10.0.0.10/32, 10.0.0.11/32 } accept comment "fatpipe: the nodes"')
    drop = text.index("\t\ttcp dport { 32768-60999 } drop")
    assert nodes < text.index("\t\ttcp dport { 22 } accept") < drop < text.index("\t\tip saddr { 10.0.0.0/24 } accept")
    rules = iptables_rules(plan["trusted"], [22], False, plan["members"], [[29400, 29405], [32768, 60999]])
    order = [rules.index(r) for r in (["-s", "10.0.0.10/32", "-j", "ACCEPT"], ["-p", "tcp", "--dport", "22", "-j", "ACCEPT"],
                                      ["-p", "tcp", "--dport", "29400:29405", "-j", "DROP"],
                                      ["-p", "udp", "--dport", "32768:60999", "-j", "DROP"],
                                      ["-s", "10.0.0.0/24", "-j", "ACCEPT"], ["-j", "DROP"])]
    assert order == sorted(order)
    # Without a declared network the nodes are all it trusts: nothing to close.
    bare = profile_plan(ssh_cluster(), None, {})["firewall"]
    assert "drop" not in nft_ruleset(bare["trusted"], [22], bare["members"], [[29400, 29405]]).replace("policy drop", "")
    assert hostfirewall.merged([[5, 9], [1, 3], [4, 4], [20, 20]]) == [[1, 9], [20, 20]]
    assert hostfirewall.guarded_ports({"trusted": ["10.0.0.0/24"]}) == []  # a plan from before members


def test_a_node_reached_at_another_private_address_sends_from_it_and_is_trusted_there():
    # private_ip a second address of the NIC: the kernel sources the node's connections from
    # the first, which SSH reaches it at. A NAT's public address (shared with others) is no node's.
    hosts = ('[[clusters.r.hosts]]\naddress = "10.0.0.20"\nprivate_ip = "10.0.0.9"\n'
             '[[clusters.r.hosts]]\naddress = "203.0.113.5"\nport = 2201\nprivate_ip = "10.0.0.100"\n'
             '[[clusters.r.hosts]]\naddress = "10.0.0.25"\nprivate_ip = "10.0.0.25"\n')
    c = parse_project(f'[clusters.r]\nprovider = "ssh"\nprivate_cidr = "10.0.0.0/24"\n{hosts}', "f.toml").clusters["r"]
    assert profile_plan(c, None, {})["firewall"]["members"] == ["10.0.0.9/32", "10.0.0.100/32", "10.0.0.25/32",
                                                                "10.0.0.20/32"]


def test_config_names_the_runs_ports_and_who_reaches_them(tmp_path):
    (tmp_path / "fatpipe.toml").write_text('[clusters.r]\nprovider = "ssh"\nprivate_cidr = "10.0.0.0/24"\n'
                                           '[[clusters.r.hosts]]\naddress = "h0"\nprivate_ip = "10.0.0.5"\n')
    doc = json.loads(CliRunner().invoke(main, ["--config", str(tmp_path / "fatpipe.toml"), "config", "--json"]).output)
    trusts = doc["clusters"]["r"]["firewall_trusts"]
    assert trusts["sources"] == ["10.0.0.0/24"] and trusts["run_ports"] == [29400, 29402]
    assert trusts["run_ports_from"] == ["10.0.0.5/32"] and "only the nodes reach the run's ports" in trusts["summary"]


NFT_LISTED = """table inet fatpipe {
\tchain input {
\t\ttype filter hook input priority filter; policy drop;
\t\tiif "lo" accept
\t\tct state established,related accept
\t\tip saddr 10.9.0.0/24 accept
\t\ttcp dport { 22, 2222 } accept
\t\tmeta l4proto { icmp, ipv6-icmp } accept
\t}
}
"""
IPT_LISTED = """-P INPUT ACCEPT
-A INPUT -j FATPIPE-INPUT
-N FATPIPE-INPUT
-A FATPIPE-INPUT -i lo -j ACCEPT
-A FATPIPE-INPUT -s 10.9.0.0/24 -j ACCEPT
-A FATPIPE-INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A FATPIPE-INPUT -j DROP
"""


def test_wait_judges_the_listing_as_nft_and_iptables_print_it():
    assert listing_problem(NFT_LISTED, 2222) is None and listing_problem(NFT_LISTED, 22) is None
    assert "SSH port 2200" in listing_problem(NFT_LISTED, 2200)
    assert "policy drop" in listing_problem(NFT_LISTED.replace("policy drop", "policy accept"), 22)
    assert listing_problem(IPT_LISTED, 22) is None
    assert "jump from INPUT" in listing_problem(IPT_LISTED.replace("-A INPUT -j FATPIPE-INPUT\n", ""), 22)
    assert listing_problem("", 22).startswith("no firewall")


def outputs(firewall):
    doc = {"name": "r", "provider": "ssh", "tier_gbps": 1, "private_cidr": "10.9.0.0/24", "firewall": firewall,
           "nodes": [{"name": "r-0", "private_ip": "10.9.0.10", "transport": "ssh", "ssh_host": "h0"}]}
    return parse_outputs(doc)


def test_an_opted_out_cluster_warns_at_launch_and_others_are_not_probed():
    [warning] = require_firewall(Cluster(None, outputs=outputs(False)))
    assert "firewall = false" in warning and "29400" in warning and "\n" not in warning
    assert require_firewall(Cluster(None, outputs=outputs(None))) == []  # clouds: their security group/firewall
    assert parse_outputs({k: v for k, v in outputs(True).model_dump().items() if k != "firewall"}).firewall is None


def test_an_empty_table_the_kernel_keeps_counts_as_no_table():
    before = "# Generated by iptables-save\n"
    after = "*filter\n:INPUT ACCEPT [3:120]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
    assert normal_save(before) == normal_save(after) == []
    theirs = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 80 -j ACCEPT\nCOMMIT\n"
    assert normal_save(theirs) == ["*filter", ":INPUT DROP", "-A INPUT -p tcp --dport 80 -j ACCEPT", "COMMIT"]


def test_the_agent_program_compiles_with_the_firewall_beside_it():
    program = agent_program({"firewall": {"trusted": ["10.9.0.0/24"]}})
    compile(program, "agent", "exec")
    assert "load('hostfirewall'" in program and program.rstrip().endswith("agent.main()")
