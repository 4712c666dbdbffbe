"""The `vm` provider without booting: its cluster file, the image recipe and mirror, its stack's JSON."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.project import Project, parse_project
from fatpipe.stacks.vm import image as vmimage


def project(tmp_path, extra: str = "") -> Project:
    text = f'[clusters.v]\nprovider = "vm"\nprivate_cidr = "10.93.0.0/24"\n{extra}\n'
    (tmp_path / "fatpipe.toml").write_text(text)
    return Project(parse_project(text, "fatpipe.toml"), tmp_path, tmp_path / "fatpipe.toml")


def test_defaults_are_two_small_vms_booted_with_aws_user_data(tmp_path):
    c = project(tmp_path).clusters["v"]
    assert (c.nodes, c.user_data, c.vcpus, c.memory_mib, c.accel) == (2, "aws", 1, 1024, "auto")
    assert c.ssh_user == "debian" and c.link_rate_gbps == 1.0 and c.region == "local"


@pytest.mark.parametrize("extra,message", [
    ('user_data = "gcp"', "'aws' or 'digitalocean'"),
    ('accel = "hvf"', "'auto', 'kvm' or 'tcg'"),
    ("memory_mib = 64", "greater than or equal to 512"),
])
def test_bad_vm_clusters_are_one_line_naming_the_key(tmp_path, extra, message):
    with pytest.raises(ConfigError) as e:
        project(tmp_path, extra)
    problems = [line for line in str(e.value).splitlines() if "clusters.v" in line]
    assert len(problems) == 1 and message in problems[0], str(e.value)


def test_mirror_is_the_one_apt_uses(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "other.sources").write_text(
        "Types: deb\nURIs: https://example.org/x\nSuites: nodistro\nComponents: main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n")
    assert vmimage.apt_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("# a comment\ndeb [arch=amd64] http://old.example/debian bookworm main\n")
    assert vmimage.apt_mirror(tmp_path) == "http://old.example/debian"
    (tmp_path / "sources.list").unlink()
    with pytest.raises(FatpipeError, match="no apt source for Debian bookworm"):
        vmimage.apt_mirror(tmp_path)


def test_a_changed_recipe_is_another_image(monkeypatch, tmp_path):
    key = vmimage.recipe_key()
    assert vmimage.recipe_key() == key  # stable
    monkeypatch.setattr(vmimage, "IMAGE_PACKAGES", (*vmimage.IMAGE_PACKAGES, "strace"))
    assert vmimage.recipe_key() != key
    # An image of the old recipe in the cache is not the current one.
    (tmp_path / key).mkdir()
    (tmp_path / key / "base.qcow2").write_bytes(b"")
    assert vmimage.cached_image(tmp_path) is None
    monkeypatch.setattr(vmimage, "IMAGE_PACKAGES", tuple(p for p in vmimage.IMAGE_PACKAGES if p != "strace"))
    assert vmimage.cached_image(tmp_path).disk == tmp_path / key / "base.qcow2"


def stack(tmp_path, extra: str = "") -> dict:
    from fatpipe.stacks.app import build_stack
    from fatpipe.stacks.toolkit import Testing

    p = project(tmp_path, extra)
    return json.loads(Testing.synth(build_stack(Testing.app(), p.clusters["v"], p)))


@pytest.mark.parametrize("cloud,mtu", [("aws", 9001), ("digitalocean", 1500)])
def test_stack_boots_each_vm_with_the_clouds_user_data_and_no_shell(tmp_path, cloud, mtu):
    from fatpipe.infra.nodevenv import node_venv
    from fatpipe.stacks.literals import literal
    from fatpipe.stacks.providers import provider_for

    doc = stack(tmp_path, f'user_data = "{cloud}"')
    p = project(tmp_path, f'user_data = "{cloud}"')
    cluster = p.clusters["v"]
    nodes = doc["resource"]["terraform_data"]
    assert list(nodes) == ["node-0", "node-1"]
    taps = set()
    for node in nodes.values():
        assert node["input"] == node["triggers_replace"]
        # The cloud's user data as its own nodes get it (no node venv: launch builds it).
        assert node["input"]["user_data"] == literal(provider_for(cloud).user_data(cluster))
        assert "torch==" not in node["input"]["user_data"]
        wheels = json.loads(node["input"]["wheels"])
        assert wheels["requirements"][:2] == [node_venv(p, p.clusters.get("v"), 0).torch, "numpy"] and wheels["index"] == []
        assert node["input"]["mtu"] == mtu
        taps.add(node["input"]["tap"])
        up, down = (p["local-exec"] for p in node["provisioner"])
        assert up["interpreter"][1:] == down["interpreter"][1:] == ["-m", "fatpipe.cli", "vm"]
        assert (up["command"], down["command"], down["when"]) == ("node-up", "node-down", "destroy")
        # Every value is environment from the resource's own input; none is command text.
        for env in (up["environment"], down["environment"]):
            assert all(v == f"${{self.input.{k[len('FATPIPE_VM_'):].lower()}}}" for k, v in env.items())
        # What only booting needs is node-up's: a node deployed before it existed can be destroyed.
        for key in ("FATPIPE_VM_USER_DATA", "FATPIPE_VM_WHEELS", "FATPIPE_VM_RTT_MS"):
            assert key in up["environment"] and key not in down["environment"]
        assert all(len(tap) <= 15 for tap in taps)
    assert len(taps) == 2
    out = doc["output"]["cluster"]["value"]
    assert out["provider"] == "vm" and [n["transport"] for n in out["nodes"]] == ["ssh", "ssh"]
    assert [n["private_ip"] for n in out["nodes"]] == ["10.93.0.10", "10.93.0.11"]
    assert {n["ssh_user"] for n in out["nodes"]} == {"debian"}


def test_node_up_without_its_environment_is_one_line(monkeypatch):
    from click.testing import CliRunner

    from fatpipe.cli.main import cli

    for key in list(__import__("os").environ):
        if key.startswith("FATPIPE_VM_"):
            monkeypatch.delenv(key)
    result = CliRunner().invoke(cli, ["vm", "node-up"])
    assert result.exit_code != 0 and "missing FATPIPE_VM_NAME" in result.output


def test_a_vm_whose_qemu_is_gone_is_vanished(tmp_path):
    import subprocess
    import sys
    import time
    from pathlib import Path

    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.stacks.vm.node import vanished_vms

    outputs = parse_outputs({"name": "v", "provider": "vm", "tier_gbps": 1, "private_cidr": "10.93.0.0/24",
                             "nodes": [{"name": f"v-{i}", "private_ip": f"10.93.0.{10 + i}", "transport": "ssh",
                                        "ssh_host": f"10.93.0.{10 + i}"} for i in range(3)]}, "v")
    # v-0 runs (a process named as node-up names QEMU), v-1's pid is someone else's, v-2 has none.
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fatpipe-v-0"])
    try:
        while b"fatpipe-v-0" not in Path(f"/proc/{alive.pid}/cmdline").read_bytes():
            time.sleep(0.05)  # until the child has exec'd (before, its cmdline is pytest's)
        for name, pid in (("v-0", alive.pid), ("v-1", 1)):
            (tmp_path / name).mkdir()
            (tmp_path / name / "qemu.pid").write_text(f"{pid}\n")
        assert vanished_vms(tmp_path, outputs) == ["v-1", "v-2"]
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize("cloud", ["aws", "digitalocean"])
def test_the_seed_mounts_the_wheel_disk_and_points_pip_at_it_alone(tmp_path, cloud):
    """The vendor data sets only what the clouds' user data leaves alone (bootcmd), with no value
    from the cluster file: the mount by the disk's label, and pip's source for every later pip."""
    import yaml

    from fatpipe.stacks.providers import provider_for
    from fatpipe.stacks.vm.seed import SITECUSTOMIZE, SITECUSTOMIZE_TEXT, vendor_data
    from fatpipe.stacks.vm.wheels import DISK_LABEL, MOUNT_POINT

    text = vendor_data(True, "52:54:00:00:00:01", 0)
    config = yaml.safe_load(text)
    assert text.startswith("#cloud-config\n") and list(config) == ["bootcmd"]
    assert f"mount -o ro LABEL={DISK_LABEL} {MOUNT_POINT}" in config["bootcmd"][1][2]
    assert config["bootcmd"][2][4:] == [SITECUSTOMIZE_TEXT, SITECUSTOMIZE]
    # pip in the SSH sessions launch builds the venv in (pam_env) takes the disk's wheels alone.
    assert config["bootcmd"][3][:2] == ["sh", "-c"] and "/etc/environment" in config["bootcmd"][3][2]
    assert config["bootcmd"][3][4:] == ["PIP_NO_INDEX=1", f"PIP_FIND_LINKS={MOUNT_POINT}/wheels", "PIP_NO_COMPILE=0"]
    p = project(tmp_path, f'user_data = "{cloud}"')
    assert "bootcmd" not in yaml.safe_load(provider_for("vm").user_data(p.clusters["v"]))


def test_the_wheel_disk_is_keyed_by_the_wheels_bytes(tmp_path):
    from fatpipe.stacks.vm.wheels import contents_key

    (tmp_path / "a-1.whl").write_bytes(b"one")
    first = contents_key(tmp_path)
    assert contents_key(tmp_path) == first
    (tmp_path / "a-1.whl").write_bytes(b"two")
    assert contents_key(tmp_path) != first


def test_rtt_is_half_the_round_trip_per_vm_passed_as_arguments_and_bounded(tmp_path):
    import yaml

    from fatpipe.stacks.vm.seed import RTT_SCRIPT, vendor_data

    rtt, _snapshot = yaml.safe_load(vendor_data(False, "52:54:00:00:00:01", 40))["bootcmd"]
    assert rtt == ["sh", "-c", RTT_SCRIPT, "fatpipe-rtt", "52:54:00:00:00:01", "20ms"]
    assert "fatpipe-rtt" not in vendor_data(False, "52:54:00:00:00:01", 0)
    assert project(tmp_path, "rtt_ms = 50").clusters["v"].rtt_ms == 50
    with pytest.raises(ConfigError) as e:
        project(tmp_path, "rtt_ms = 1001")
    assert "rtt_ms" in str(e.value) and "less than or equal to 1000" in str(e.value)


def test_a_venv_sees_the_disks_packages_after_its_own_and_the_system_python_does_not(tmp_path):
    """The guest's sitecustomize, run by this machine's python in a venv and outside one."""
    import subprocess
    import sys

    from fatpipe.stacks.vm.seed import SITECUSTOMIZE_TEXT
    from fatpipe.stacks.vm.wheels import SITE_PACKAGES

    show = SITECUSTOMIZE_TEXT + "print(sys.path[-1] == " + repr(SITE_PACKAGES) + ")\n"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    seen = {name: subprocess.run([python, "-c", show], capture_output=True, text=True, check=True).stdout.strip()
            for name, python in (("venv", str(tmp_path / "venv" / "bin" / "python")), ("system", sys.base_prefix + "/bin/python3"))}
    assert seen == {"venv": "True", "system": "False"}


@pytest.mark.parametrize("node_dir", ["/", "/home/me", ".", "..", ".fatpipe/c/nodes", "../x/nodes/y",
                                      ".fatpipe/c/nodes/../../..", "data/c/nodes/n", ".fatpipe/../nodes/n"])
def test_node_down_refuses_a_folder_that_is_no_nodes_own(monkeypatch, tmp_path, node_dir):
    # node-down removes the node's folder: a hostile or mistaken value must never name another.
    from click.testing import CliRunner

    from fatpipe.cli.main import cli
    from fatpipe.stacks.vm.inputs import NODE_KEYS, VM_ENV_PREFIX

    for key in NODE_KEYS:
        monkeypatch.setenv(f"{VM_ENV_PREFIX}{key.upper()}", "1")
    monkeypatch.setenv(f"{VM_ENV_PREFIX}NODE_DIR", node_dir)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep").write_text("mine")
    result = CliRunner().invoke(cli, ["vm", "node-down"])
    assert result.exit_code != 0 and "is not .fatpipe/<cluster>/nodes/<node>" in result.output, result.output
    assert (tmp_path / "keep").read_text() == "mine"


def test_the_seed_snapshots_the_kernels_tcp_settings_once_with_values_as_arguments(tmp_path):
    """The snapshot's script, run here on this machine's kernel: every profile sysctl as `sysctl
    -n` prints it (spaces for tabs), the NIC found by its MAC with its root qdisc; a second run
    leaves the file alone (a later boot would read the profile's values)."""
    import subprocess

    import yaml

    from fatpipe.infra.tiers import normalize_sysctl, tier_profile
    from fatpipe.stacks.vm.seed import KERNEL_SYSCTLS, kernel_sysctls_command, vendor_data

    command = yaml.safe_load(vendor_data(True, "52:54:00:00:00:01", 0))["bootcmd"][-1]
    assert command == kernel_sysctls_command("52:54:00:00:00:01")
    assert command[3:5] == [KERNEL_SYSCTLS, "52:54:00:00:00:01"] and command[5:] == list(tier_profile("1g").sysctls)
    out = tmp_path / "sub" / "kernel-sysctls.json"
    lo_mac = open("/sys/class/net/lo/address").read().strip()
    subprocess.run([*command[:3], str(out), lo_mac, *command[5:]], check=True)
    doc = json.loads(out.read_text())
    for name, value in doc["sysctls"].items():
        shown = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, check=True).stdout
        assert value == normalize_sysctl(shown)
    assert list(doc["sysctls"]) == list(tier_profile("1g").sysctls) and doc["nic"] == "lo"
    assert doc["root_qdisc"] and " " not in doc["root_qdisc"]
    out.write_text("{}")
    subprocess.run([*command[:3], str(out), lo_mac, *command[5:]], check=True)
    assert out.read_text() == "{}"
    missing = subprocess.run([*command[:3], str(tmp_path / "x.json"), "52:54:00:ff:ff:ff"], capture_output=True, text=True)
    assert missing.returncode != 0 and "no NIC with MAC 52:54:00:ff:ff:ff" in missing.stderr
    assert not (tmp_path / "x.json").exists()


def test_the_snapshot_skips_a_nic_that_vanishes_while_listed(tmp_path):
    """A NIC renamed or removed between the listing and the read (udev at boot; on this machine,
    namespaces torn down beside the test) makes its `address` unreadable: the scan passes over it.
    The script runs as the seed runs it, its sysfs folder swapped for one with such a NIC."""
    import subprocess

    from fatpipe.stacks.vm.seed import kernel_sysctls_command

    net = tmp_path / "class-net"
    (net / "gone" / "address").mkdir(parents=True)  # reading it fails as a vanished NIC's does
    (net / "lo").mkdir()
    lo_mac = open("/sys/class/net/lo/address").read().strip()
    (net / "lo" / "address").write_text(lo_mac + "\n")
    command = kernel_sysctls_command(lo_mac)
    assert '"/sys/class/net"' in command[2]
    script = command[2].replace('"/sys/class/net"', json.dumps(str(net)))
    out = tmp_path / "kernel-sysctls.json"
    subprocess.run([*command[:2], script, str(out), lo_mac, *command[5:]], check=True)
    assert json.loads(out.read_text())["nic"] == "lo"
