"""Real applies of sim stacks: terraform (or cdktf) creates shaped namespaces, destroy leaves nothing."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import skip_or_fail

from fatpipe.infra.outputs import read_outputs
from fatpipe.infra.project import load_project
from fatpipe.stacks.engine import CDKTF_LOCAL, destroy_cluster, outputs_path
from fatpipe.stacks.sim import net as simnet

pytestmark = pytest.mark.slow

CLUSTERS = {  # name: (nodes, tier, isolation, private_cidr); names and networks unique to this file
    "t-sim-a": (3, "1g", "netns", "10.94.0.0/24"),
    "t-sim-b": (2, "10g", "netns", "10.95.0.0/24"),
    "t-sim-lb": (2, "1g", "loopback", "10.96.0.0/24"),
    "t-sim-f": (2, "1g", "netns", "10.97.0.0/24"),
}
FOREIGN_NS = "fp-t-sim-f-1"


@pytest.fixture
def terraform():
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform on PATH")


@pytest.fixture
def sim_project(project_dir, terraform):
    """A project with the test clusters; whatever a test leaves deployed is destroyed after it."""
    text = ""
    for name, (nodes, tier, isolation, cidr) in CLUSTERS.items():
        text += (f'[clusters.{name}]\nprovider = "sim"\nnodes = {nodes}\ntier = "{tier}"\n'
                 f'isolation = "{isolation}"\nprivate_cidr = "{cidr}"\n\n')
    (project_dir / "fatpipe.toml").write_text(text)
    project = load_project()
    yield project
    for name in CLUSTERS:
        if (project.state_dir(name) / "terraform.tfstate").exists():
            try:
                destroy_cluster(project, project.cluster(name))
            except Exception as e:  # still sweep below; report after
                print(f"cleanup of {name} failed: {e}", file=sys.stderr)
        simnet.sweep_cluster(name, project.state_dir(name) / "nodes")
    subprocess.run(["ip", "netns", "del", FOREIGN_NS], capture_output=True)


def test_two_netns_clusters_apply_coexist_and_destroy_cleanly(needs_netns, sim_project, run_cli):
    for name in ("t-sim-a", "t-sim-b"):
        result = run_cli("deploy", name)
        assert result.exit_code == 0, result.output
    a = read_outputs(outputs_path(sim_project, "t-sim-a"))
    assert json.loads(outputs_path(sim_project, "t-sim-a").read_text())["nodes"]  # bare shape
    assert (a.provider, a.region, a.tier_gbps, a.rdzv_endpoint) == ("sim", "local", 1, "10.94.0.10:29400")
    assert [n.private_ip for n in a.nodes] == ["10.94.0.10", "10.94.0.11", "10.94.0.12"]
    assert_cluster_up("t-sim-a", a, rate_bytes=125_000_000)
    assert_cluster_up("t-sim-b", read_outputs(outputs_path(sim_project, "t-sim-b")),
                      rate_bytes=1_250_000_000)
    assert tcp_reaches(a.nodes[0].netns, a.nodes[2].netns, a.nodes[2].private_ip)

    again = run_cli("deploy", "t-sim-a", "-v")
    assert "0 added, 0 changed, 0 destroyed" in again.output  # re-deploy is a no-op

    assert run_cli("down", "t-sim-b").exit_code == 0
    assert_nothing_left("t-sim-b", sim_project)
    assert_cluster_up("t-sim-a", a, rate_bytes=125_000_000)  # the other cluster is untouched
    assert tcp_reaches(a.nodes[1].netns, a.nodes[0].netns, a.nodes[0].private_ip)

    result = run_cli("down", "t-sim-a")
    assert result.exit_code == 0 and "leftovers" not in result.output, result.output
    assert_nothing_left("t-sim-a", sim_project)


ENGINES = ["terraform", "cdktf"]


@pytest.mark.parametrize("engine", ENGINES)
def test_loopback_cluster_apply_and_destroy(engine, sim_project, run_cli):
    if engine == "cdktf" and not _has_cdktf():
        skip_or_fail("needs the cdktf CLI (make cdktf-cli)")
    result = run_cli("deploy", "t-sim-lb", "--engine", engine)
    assert result.exit_code == 0, result.output
    out = read_outputs(outputs_path(sim_project, "t-sim-lb"))
    assert [n.private_ip for n in out.nodes] == ["127.96.0.10", "127.96.0.11"]
    assert {n.transport for n in out.nodes} == {"local"}
    for node in out.nodes:
        ready = json.loads(open(node.ready_file).read())
        assert ready["iface"] == "lo" and ready["rate_gbit"] is None
        with socket.create_server((node.private_ip, 0)):  # the address is usable as-is
            pass
    assert run_cli("down", "t-sim-lb", "--engine", engine).exit_code == 0
    assert not outputs_path(sim_project, "t-sim-lb").exists()
    assert not (sim_project.state_dir("t-sim-lb") / "nodes").exists()


def test_failed_apply_reports_what_exists_and_down_removes_it(needs_netns, sim_project, run_cli):
    # A namespace that is not the project's blocks node 1: node-up refuses to adopt it.
    subprocess.run(["ip", "netns", "add", FOREIGN_NS], check=True)
    result = run_cli("deploy", "t-sim-f")
    assert result.exit_code != 0
    text = " ".join(result.output.split())  # terraform wraps its diagnostics
    assert "is not this project's node" in text, text
    exists = text.split("resources that exist now: ")[1].split(" fix the cause")[0]
    assert "terraform_data.node-0" in exists, text
    assert not outputs_path(sim_project, "t-sim-f").exists()
    # A failed create leaves node 1 tainted, and terraform runs no destroy provisioner for a
    # tainted resource: down sweeps this project's nodes, and leaves (and names) the namespace
    # that is not the project's, though it is named like one of its nodes.
    down = run_cli("down", "t-sim-f")
    assert down.exit_code == 0
    assert "left alone (another project's): fp-t-sim-f-1" in " ".join(down.output.split()), down.output
    assert simnet.leftover_netns("t-sim-f") == [FOREIGN_NS]
    subprocess.run(["ip", "netns", "del", FOREIGN_NS], check=True)
    assert_nothing_left("t-sim-f", sim_project)


# --- checks -------------------------------------------------------------------------------------


def assert_cluster_up(cluster: str, outputs, rate_bytes: int):
    for node in outputs.nodes:
        names = simnet.link_names(cluster, int(node.name.rsplit("-", 1)[1]))
        assert node.transport == "netns" and node.netns == names["netns"]
        for argv in (["tc", "-j", "qdisc", "show", "dev", names["host_if"]],
                     ["tc", "-j", "-n", node.netns, "qdisc", "show", "dev", "eth0"]):
            qdisc = json.loads(_out(argv))[0]
            assert qdisc["kind"] == "tbf" and qdisc["options"]["rate"] == rate_bytes
        addrs = json.loads(_out(["ip", "-n", node.netns, "-j", "addr", "show", "eth0"]))
        assert node.private_ip in [a["local"] for a in addrs[0]["addr_info"]]
        ready = json.loads(open(node.ready_file).read())
        for key in ("sysctls", "namespaced", "not_namespaced", "iface", "mtu", "rate_gbit"):
            assert key in ready, key


def assert_nothing_left(cluster: str, project):
    assert simnet.leftover_netns(cluster) == []
    links = _out(["ip", "-o", "link", "show"])
    digest_names = simnet.link_names(cluster, 0)
    assert digest_names["bridge"] not in links
    assert digest_names["host_if"].rsplit("-", 1)[0] not in links  # no veth of any node
    assert not outputs_path(project, cluster).exists()
    assert not (project.state_dir(cluster) / "nodes").exists()


def tcp_reaches(src_ns: str, dst_ns: str, ip: str, port: int = 29591) -> bool:
    """Open a TCP connection from one namespace to a listener in another (over the bridge)."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", dst_ns, sys.executable, "-c",
         f"import socket; s = socket.create_server(({ip!r}, {port})); s.settimeout(10); "
         "c, _ = s.accept(); c.sendall(b'ok')"])
    try:
        client = (f"import socket, time\nfor _ in range(50):\n"
                  f"    try: print(socket.create_connection(({ip!r}, {port}), 2).recv(2).decode()); break\n"
                  f"    except OSError: time.sleep(0.1)\n")
        out = subprocess.run(["ip", "netns", "exec", src_ns, sys.executable, "-c", client],
                             capture_output=True, text=True, timeout=20).stdout
        return out.strip() == "ok"
    finally:
        server.kill()
        server.wait(timeout=10)


def _out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _has_cdktf() -> bool:
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    return (repo / CDKTF_LOCAL).is_file() or bool(shutil.which("cdktf"))
