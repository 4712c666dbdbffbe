"""The sim stack's JSON (no root needed) and single sim nodes made and removed by node-up/node-down."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.stacks.providers import sim_stack as sim
from fatpipe.stacks.sim import net as simnet

TOML = """
[clusters.t-sim-syn]
provider = "sim"
nodes = 3
tier = "10g"
isolation = "{isolation}"
private_cidr = "10.91.0.0/24"
"""


def synth_stack(project_dir, isolation: str) -> dict:
    from fatpipe.stacks.app import synth

    (project_dir / "fatpipe.toml").write_text(TOML.format(isolation=isolation))
    project = load_project()
    folder = synth(project, [project.cluster("t-sim-syn")])["t-sim-syn"]
    return json.loads((folder / "cdk.tf.json").read_text())


@pytest.fixture
def no_netns(monkeypatch):
    monkeypatch.setattr(sim, "netns_usable", lambda: False)


@pytest.fixture
def with_netns(monkeypatch):
    monkeypatch.setattr(sim, "netns_usable", lambda: True)


def test_stack_uses_only_terraform_builtins(project_dir, no_netns):
    doc = synth_stack(project_dir, "auto")
    assert "provider" not in doc and "required_providers" not in doc.get("terraform", {})
    assert list(doc["resource"]) == ["terraform_data"]
    nodes = doc["resource"]["terraform_data"]
    assert len(nodes) == 3
    for node in nodes.values():
        assert node["input"] == node["triggers_replace"]  # a changed node is replaced
        up, down = (p["local-exec"] for p in node["provisioner"])
        assert "sim node-up" in up["command"] and "when" not in up
        assert "sim node-down" in down["command"] and down["when"] == "destroy"
        # Destroy-time provisioners may reference only self; nothing else is interpolated.
        refs = [part.split("}")[0] for part in down["command"].split("${")[1:]]
        assert refs and all(ref.startswith("self.input.") for ref in refs)
        assert up["working_dir"] == down["working_dir"] == "../../.."
        # Only the interpreter is an absolute path; the project's folder is not baked in.
        assert str(project_dir) not in json.dumps(node)


def test_loopback_outputs_follow_the_contract(project_dir, no_netns):
    doc = synth_stack(project_dir, "auto")
    value = doc["output"]["cluster"]["value"]
    outputs = parse_outputs(value)
    assert (outputs.provider, outputs.region, outputs.tier_gbps) == ("sim", "local", 10)
    assert [n.private_ip for n in outputs.nodes] == ["127.91.0.10", "127.91.0.11", "127.91.0.12"]
    assert {n.transport for n in outputs.nodes} == {"local"}
    for node in outputs.nodes:
        assert node.ready_file == str(project_dir / ".fatpipe/t-sim-syn/nodes" / node.name / "ready.json")


def test_netns_outputs_use_the_private_network(project_dir, with_netns):
    value = synth_stack(project_dir, "auto")["output"]["cluster"]["value"]
    outputs = parse_outputs(value)
    assert [n.private_ip for n in outputs.nodes] == ["10.91.0.10", "10.91.0.11", "10.91.0.12"]
    assert [n.netns for n in outputs.nodes] == ["fp-t-sim-syn-0", "fp-t-sim-syn-1", "fp-t-sim-syn-2"]
    assert outputs.rdzv_endpoint == "10.91.0.10:29400"


def test_netns_without_root_is_refused(project_dir, no_netns):
    with pytest.raises(ConfigError, match="needs root"):
        synth_stack(project_dir, "netns")


def test_interface_names_fit_and_differ_per_cluster():
    longest = "a" * 24
    for cluster in (longest, "demo", "t"):
        names = simnet.link_names(cluster, 511)
        assert len(names["host_if"]) <= 15 and len(names["bridge"]) <= 15
    assert simnet.link_names("demo", 0)["bridge"] != simnet.link_names("demo2", 0)["bridge"]
    assert simnet.loopback_ip("10.42.0.0/24", 0, 10) == "127.42.0.10"
    assert simnet.loopback_ip("10.43.0.0/24", 0, 10) != simnet.loopback_ip("10.42.0.0/24", 0, 10)


def test_tbf_burst_is_large_enough_at_10g():
    assert simnet.tbf_burst_bytes(10) >= 1_000_000
    assert simnet.tbf_burst_bytes(1) >= 64 * 1024


# --- one node, through the hidden CLI (root) ---------------------------------------------------


def node_args(node_dir, index: int = 0) -> list[str]:
    names = simnet.link_names("t-sim-one", index)
    return ["--cluster", "t-sim-one", "--index", str(index), "--isolation", "netns",
            "--address", f"10.92.0.{10 + index}/24", "--tier", "1g", "--rate-gbit", "1",
            "--node-dir", str(node_dir), "--netns", names["netns"], "--bridge", names["bridge"],
            "--host-if", names["host_if"]]


@pytest.fixture
def one_node(needs_netns, run_cli, project_dir):
    node_dir = project_dir / "nodes" / "t-sim-one-0"
    yield node_dir
    simnet.sweep_cluster("t-sim-one", project_dir / "nodes")


def test_node_up_shapes_both_directions_and_reports(one_node, run_cli):
    names = simnet.link_names("t-sim-one", 0)
    result = run_cli("sim", "node-up", *node_args(one_node))
    assert result.exit_code == 0, result.output
    ready = json.loads((one_node / "ready.json").read_text())
    for key in ("sysctls", "namespaced", "not_namespaced", "iface", "mtu", "rate_gbit"):
        assert key in ready
    assert ready["iface"] == "eth0" and ready["rate_gbit"] == 1
    assert "net.ipv4.tcp_rmem" in ready["namespaced"]  # namespaced since Linux 4.15
    assert set(ready["sysctls"]) >= set(ready["namespaced"]) | set(ready["not_namespaced"])
    for argv in (["tc", "-j", "qdisc", "show", "dev", names["host_if"]],
                 ["tc", "-j", "-n", names["netns"], "qdisc", "show", "dev", "eth0"]):
        qdisc = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)[0]
        assert qdisc["kind"] == "tbf" and qdisc["options"]["rate"] == 125_000_000  # bytes/s
    lo = subprocess.run(["ip", "-n", names["netns"], "-j", "link", "show", "lo"],
                        capture_output=True, text=True, check=True).stdout
    assert "UP" in json.loads(lo)[0]["flags"]


def test_node_down_is_idempotent_and_stops_processes(one_node, run_cli):
    names = simnet.link_names("t-sim-one", 0)
    assert run_cli("sim", "node-up", *node_args(one_node)).exit_code == 0
    sleeper = subprocess.Popen(["ip", "netns", "exec", names["netns"], "sleep", "300"])
    time.sleep(0.2)
    for _ in range(2):
        result = run_cli("sim", "node-down", *node_args(one_node))
        assert result.exit_code == 0, result.output
    assert sleeper.wait(timeout=10) is not None
    assert names["netns"] not in simnet.leftover_netns("t-sim-one") + _netns()
    for link in (names["host_if"], names["bridge"]):
        assert subprocess.run(["ip", "link", "show", link], capture_output=True).returncode != 0
    assert not one_node.exists()
    # A node that never existed goes down cleanly too.
    assert run_cli("sim", "node-down", *node_args(one_node, index=7)).exit_code == 0


def test_bridge_stays_until_the_last_node(one_node, run_cli):
    bridge = simnet.link_names("t-sim-one", 0)["bridge"]
    for index in (0, 1):
        assert run_cli("sim", "node-up", *node_args(one_node.parent / f"n{index}", index)).exit_code == 0
    assert run_cli("sim", "node-down", *node_args(one_node.parent / "n0", 0)).exit_code == 0
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode == 0
    assert run_cli("sim", "node-down", *node_args(one_node.parent / "n1", 1)).exit_code == 0
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0


def test_loopback_node_needs_no_root(tmp_path):
    node_dir = tmp_path / "t-sim-lo-0"
    argv = [sys.executable, "-m", "fatpipe.cli", "sim", "node-up", "--cluster", "t-sim-lo",
            "--index", "0", "--isolation", "loopback", "--address", "127.93.0.10/8", "--tier", "1g",
            "--rate-gbit", "1", "--node-dir", str(node_dir)]
    subprocess.run(argv, check=True, capture_output=True)
    ready = json.loads((node_dir / "ready.json").read_text())
    assert ready["iface"] == "lo" and ready["rate_gbit"] is None and ready["namespaced"] == []
    argv[4] = "node-down"
    for _ in range(2):
        subprocess.run(argv, check=True, capture_output=True)
    assert not node_dir.exists()


def _netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
