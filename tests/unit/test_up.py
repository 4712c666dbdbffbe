"""`fatpipe wait`: per-node reachability, the ready marker, and sysctls read back against the tier."""

from __future__ import annotations

import json

from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.tiers import tier_profile
from fatpipe.ops.reach.transport import LocalTransport, SshTransport
from fatpipe.ops.reach.wait import check_node, parse_probe, probe_command


def node(tmp_path, i=0, **extra):
    doc = {"name": "c", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
           "nodes": [{"name": f"c-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local",
                      "ready_file": str(tmp_path / f"ready-{i}.json"), **extra}]}
    return parse_outputs(doc).nodes[0]


def test_probe_reads_marker_and_proc_sys(tmp_path):
    (tmp_path / "m.json").write_text('{"iface": "eth0",\n "mtu": 1500}')
    result = LocalTransport("n").run(probe_command(str(tmp_path / "m.json"), ["net.ipv4.tcp_rmem", "no.such"]))
    reachable, marker, values = parse_probe(result.stdout)
    assert reachable and marker == {"iface": "eth0", "mtu": 1500}
    assert len(values["net.ipv4.tcp_rmem"].split()) == 3 and "no.such" not in values


def test_node_states_name_what_is_missing(tmp_path):
    declared = {"net.ipv4.tcp_rmem": "1 2 3"}
    n = node(tmp_path)
    state = check_node(LocalTransport(n.name), n, declared)
    assert not state.ready and state.reachable and "no ready marker" in state.reason

    # A loopback sim node namespaces nothing: nothing to compare, ready.
    (tmp_path / "ready-0.json").write_text(json.dumps({"iface": "lo", "mtu": 65536, "namespaced": []}))
    state = check_node(LocalTransport(n.name), n, declared)
    assert state.ready and state.checked == 0 and state.iface == "lo"

    # A namespaced sysctl whose live value differs from the tier's is named with both values.
    (tmp_path / "ready-0.json").write_text(json.dumps({"iface": "lo", "namespaced": ["net.ipv4.tcp_rmem"]}))
    state = check_node(LocalTransport(n.name), n, declared)
    assert not state.ready and state.booted
    assert state.reason.startswith("sysctl net.ipv4.tcp_rmem: ") and "(want 1 2 3)" in state.reason

    ssh = SshTransport("c-0", "127.0.0.1", tmp_path / "kh", port=9, config="/dev/null")
    state = check_node(ssh, n, declared, timeout=20)
    assert not state.reachable and state.reason.startswith("unreachable: ")


def test_a_node_whose_boot_went_wrong_is_not_ready(tmp_path):
    """The node profile's marker: packages that did not install, a qdisc that is not fq."""
    n = node(tmp_path)
    good = {"iface": "ens5", "packages": {"iperf3": True, "rsync": True}, "qdisc": ["mq", "fq", "fq"]}
    (tmp_path / "ready-0.json").write_text(json.dumps(good))
    assert check_node(LocalTransport(n.name), n, {}).ready
    for change, reason in [({"packages": {"iperf3": False, "rsync": True}}, "packages not installed: iperf3"),
                           ({"qdisc": ["mq", "pfifo_fast"]}, "qdisc mq pfifo_fast on ens5"),
                           ({"qdisc": ["fq_codel"]}, "qdisc fq_codel")]:
        (tmp_path / "ready-0.json").write_text(json.dumps({**good, **change}))
        state = check_node(LocalTransport(n.name), n, {})
        assert not state.ready and state.reason.startswith(reason), state.reason


def test_wait_command_times_out_with_per_node_reasons(run_cli, project_dir):
    outputs = {"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
               "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local",
                          "ready_file": str(project_dir / f"ready-{i}.json")} for i in range(2)]}
    (project_dir / "outputs.json").write_text(json.dumps(outputs))
    (project_dir / "ready-0.json").write_text(json.dumps({"iface": "lo", "mtu": 65536, "namespaced": []}))
    result = run_cli("wait", "--outputs", "outputs.json", "--wait-timeout", "2")
    assert result.exit_code == 1
    assert "1 node(s) not ready after 2 s" in result.output and "demo-1: booting: no ready marker" in result.output
    (project_dir / "ready-1.json").write_text(json.dumps({"iface": "lo", "mtu": 65536, "namespaced": []}))
    result = run_cli("wait", "--outputs", "outputs.json", "--wait-timeout", "5")
    assert result.exit_code == 0 and "2/2 ready" in result.output


def test_declared_sysctls_come_from_the_tier():
    from fatpipe.ops.reach.wait import declared_sysctls

    outputs = parse_outputs({"name": "c", "provider": "sim", "tier_gbps": 10, "private_cidr": "10.42.0.0/24",
                             "nodes": [{"name": "c-0", "private_ip": "127.0.0.10", "transport": "local"}]})
    assert declared_sysctls(outputs) == tier_profile("10g").sysctls


def test_phase_notes_are_shown_as_written_not_read_as_markup():
    import io

    from rich.console import Console

    from fatpipe.cli.render import Phases

    buffer = io.StringIO()
    out = Console(file=buffer, width=200, color_system=None)
    phases = Phases(out)
    phases.skip("data", "no [data] declared")
    phases.get("launch").state, phases.get("launch").note = "failed", "gloo [/pytorch/gloo/pair.cc:553] closed"
    out.print(phases.table())
    text = buffer.getvalue()
    assert "[skip] data: no [data] declared" in text
    assert "no [data] declared" in text.split("time per phase")[1]
    assert "[/pytorch/gloo/pair.cc:553]" in text
