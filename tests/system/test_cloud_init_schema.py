"""The node profile is valid cloud-config: `cloud-init schema` accepts the user data of every
provider and tier as rendered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import skip_or_fail

from fatpipe.infra.clusters import AwsCluster, DigitalOceanCluster, SimCluster
from fatpipe.infra.spec import TIER_GBPS
from fatpipe.infra.vmspec import VmCluster
from fatpipe.stacks.providers import PROVIDERS


def cluster(provider: str, tier: str, key: str):
    if provider == "sim":
        return SimCluster(provider="sim", name="s", nodes=2, tier=tier)
    if provider == "vm":  # local VMs booted with a cloud's own user data (DigitalOcean's here)
        return VmCluster(provider="vm", name="v", nodes=2, tier=tier, user_data="digitalocean")
    common = dict(name="c", nodes=3, tier=tier, ssh_public_key=key, ssh_cidr="203.0.113.7/32")
    if provider == "aws":
        return AwsCluster(provider="aws", region="us-east-1", **common)
    return DigitalOceanCluster(provider="digitalocean", region="nyc3", **common)


@pytest.mark.parametrize("tier", list(TIER_GBPS))
# The ssh provider has no user data: its machines get the same profile over SSH.
@pytest.mark.parametrize("provider", [name for name, p in PROVIDERS.items() if p.user_data_limit])
def test_user_data_passes_cloud_init_schema(provider, tier, tmp_path):
    if not shutil.which("cloud-init"):
        skip_or_fail("cloud-init is not installed (Debian package cloud-init)")
    key = tmp_path / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKey ${evil} %{ x }\n")
    path = tmp_path / "user-data"
    path.write_text(PROVIDERS[provider].user_data(cluster(provider, tier, str(key))))
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "Valid cloud-config" in proc.stdout, proc.stdout + proc.stderr


def test_cloud_init_schema_refuses_a_broken_document(tmp_path):
    """The check can fail: a runcmd that is not a list is refused."""
    if not shutil.which("cloud-init"):
        skip_or_fail("cloud-init is not installed (Debian package cloud-init)")
    path = tmp_path / "user-data"
    path.write_text("#cloud-config\n{\"runcmd\": 5}\n")
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "runcmd" in proc.stdout + proc.stderr


def cloud_project(folder, provider: str):
    """A project with one cloud cluster and a `[node]` declaration (packages and a requirements file)."""
    from fatpipe.infra.project import load_project

    (folder / "id.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKey t@t\n")
    where = 'region = "us-east-1"' if provider == "aws" else 'region = "nyc3"'
    (folder / "fatpipe.toml").write_text(f"""\
[clusters.c]
provider = "{provider}"
{where}
nodes = 2
tier = "10g"
ssh_public_key = "{folder / 'id.pub'}"
ssh_cidr = "203.0.113.7/32"

[node]
torch = "torch==2.13.0"
packages = ["tiktoken"]
""")
    (folder / "requirements.txt").write_text("einops\n")
    project = load_project(folder / "fatpipe.toml")
    return project, project.cluster("c")


@pytest.mark.parametrize("provider", ["aws", "digitalocean"])
def test_clouds_build_the_node_venv_during_boot(provider, tmp_path):
    """The user data starts the venv build first (a transient unit, so boot goes on) and writes the
    ready marker only after it finished; the document stays valid cloud-config."""
    from fatpipe.infra.nodevenv import node_venv, venv_stamp
    from fatpipe.stacks.bootenv import BOOT_ENV_SCRIPT, BOOT_ENV_SPEC

    if not shutil.which("cloud-init"):
        skip_or_fail("cloud-init is not installed (Debian package cloud-init)")
    project, cluster = cloud_project(tmp_path, provider)
    text = PROVIDERS[provider].user_data(cluster, project)
    (tmp_path / "user-data").write_text(text)
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(tmp_path / "user-data")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Valid cloud-config" in proc.stdout, proc.stdout + proc.stderr
    doc = json.loads(text.split("\n", 1)[1])
    assert doc["runcmd"][0][0] == "systemd-run" and doc["runcmd"][0][-1] == BOOT_ENV_SCRIPT
    assert doc["runcmd"][-1] == ["sh", "-c", f"{BOOT_ENV_SCRIPT} --wait; /usr/local/sbin/fatpipe-ready"]
    spec = json.loads(next(f["content"] for f in doc["write_files"] if f["path"] == BOOT_ENV_SPEC))
    assert spec["stamp"] == venv_stamp(project.root, node_venv(project, cluster.name, cluster.gpus_per_node))  # launch reuses it
    assert (spec["torch"], spec["packages"], spec["requirements"]) == ("torch==2.13.0", ["tiktoken"], "einops\n")
    assert "python3-venv" in doc["packages"]


def test_the_boot_script_builds_a_venv_launch_takes_as_current(tmp_path):
    """The boot script itself, run as cloud-init would (root, runuser to the login user), against
    stand-in wheels: the venv imports them, carries launch's stamp, and the folder is marked."""
    import getpass

    from fatpipe.infra.node import PROJECT_MARKER, REMOTE_VENV
    from fatpipe.stacks.bootenv import SCRIPT_TEXT

    from .test_node_venv_build import imports, make_wheel

    if os.geteuid() != 0 or not shutil.which("runuser"):
        skip_or_fail("the boot script runs as root with runuser, as cloud-init does")
    wheels, folder = tmp_path / "wheels", tmp_path / "fatpipe" / "c"
    wheels.mkdir()
    for name, version in (("torch", "2.13.0"), ("numpy", "2.3.1"), ("einops", "0.8.0"), ("tiktoken", "0.9.0")):
        make_wheel(wheels, name, version)
    spec, done = tmp_path / "node-env.json", tmp_path / "state" / "node-env"
    spec.write_text(json.dumps({"user": getpass.getuser(), "cluster": "c", "workdir": str(folder), "stamp": "s1",
                                "torch": "torch==2.13.0", "index": "", "packages": ["tiktoken"],
                                "requirements": "einops\n"}))
    script = tmp_path / "fatpipe-node-env"
    script.write_text(SCRIPT_TEXT.format(done=str(done), spec=str(spec), marker=PROJECT_MARKER, venv=REMOTE_VENV,
                                         stamp_file=f"{REMOTE_VENV}/.fatpipe-stamp", wait_s=60))
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}  # "the index": the folder
    env.pop("VIRTUAL_ENV", None)
    built = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0 and done.read_text() == "ok\n", built.stderr[-3000:] + done.read_text()
    assert [imports(folder, m) for m in ("torch", "numpy", "einops", "tiktoken")] == ["2.13.0", "2.3.1", "0.8.0", "0.9.0"]
    assert (folder / REMOTE_VENV / ".fatpipe-stamp").read_text() == "s1\n"
    assert (folder / PROJECT_MARKER).read_text() == "c\n"
    waited = subprocess.run([sys.executable, str(script), "--wait"], capture_output=True, text=True, timeout=120)
    assert waited.returncode == 0 and "fatpipe node venv: ok" in waited.stdout

    done.write_text("failed: CalledProcessError: pip\n")  # said in cloud-init's log; launch rebuilds it
    waited = subprocess.run([sys.executable, str(script), "--wait"], capture_output=True, text=True, timeout=120)
    assert waited.returncode == 1 and "failed: CalledProcessError" in waited.stdout
