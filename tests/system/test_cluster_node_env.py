"""Clusters of one project with node environments of their own (`[clusters.<name>.node]`): each
cluster resolves its own environment (which launch builds; no user data carries it), and
the preflight asks the index for each cluster's own torch; a launch over real SSH takes the venv
its cluster's own declaration stamps."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import skip_or_fail

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER, REMOTE_VENV
from fatpipe.infra.nodevenv import node_venv, venv_stamp
from fatpipe.infra.project import Project, load_project, parse_project, project_id_at
from fatpipe.ops.reach.cluster import Cluster

from .conftest import declared_env_cli, require_ssh_sim, ssh_sim_toml
from .test_wheel_check import WHEEL, index  # noqa: F401 (the local package index fixture)

pytestmark = pytest.mark.timeout(900)
CU128 = "https://download.pytorch.org/whl/cu128"
CLOUD = 'nodes = 2\ntier = "10g"\nssh_public_key = "{key}"\nssh_cidr = "198.51.100.7/32"\n'
PROJECT = f"""\
[clusters.cpu]
provider = "aws"
region = "us-east-1"
{CLOUD}
[clusters.gpu]
provider = "aws"
region = "us-east-1"
gpus_per_node = 1
private_cidr = "10.50.0.0/24"
{CLOUD}
[clusters.gpu.node]
torch = "torch==2.12.0"
torch_index = "{CU128}"
requirements = "gpu-requirements.txt"

[clusters.ocean]
provider = "digitalocean"
region = "nyc3"
private_cidr = "10.60.0.0/24"
{CLOUD}
[clusters.ocean.node]
packages = ["einops>=0.7"]

[node]
torch = "torch==2.13.0"
packages = ["tiktoken"]
"""


def project_at(root, text: str = PROJECT) -> Project:
    key = root / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyForSynthesisOnly t@t\n")
    (root / "requirements.txt").write_text("numpy\n")
    (root / "gpu-requirements.txt").write_text("triton\n")
    return Project(parse_project(text.replace("{key}", str(key)), "fatpipe.toml"), root, root / "fatpipe.toml")


def test_each_cluster_resolves_its_own_node_environment_and_no_user_data_holds_it(tmp_path, monkeypatch):
    """Each cluster's own declaration is what launch builds (its stamp); the stacks' user data,
    valid cloud-config, carries none of it: launch builds the venv, not the boot."""
    from fatpipe.stacks.app import build_stack
    from fatpipe.stacks.toolkit import Testing

    if not shutil.which("cloud-init"):
        skip_or_fail("cloud-init is not installed (Debian package cloud-init)")
    monkeypatch.delenv("FATPIPE_TORCH_INDEX_URL", raising=False)
    project = project_at(tmp_path)
    app = Testing.app()
    for name, cluster in project.clusters.items():
        text = json.loads(Testing.synth(build_stack(app, cluster, project)))["locals"]["user_data"]
        (tmp_path / f"user-data-{name}").write_text(text)
        proc = subprocess.run(["cloud-init", "schema", "--config-file", str(tmp_path / f"user-data-{name}")],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "Valid cloud-config" in proc.stdout, proc.stdout + proc.stderr
        assert not any(word in text for word in ("torch==", "tiktoken", "einops", "triton")), name

    def declared(name: str) -> tuple:
        venv = node_venv(project, project.clusters[name], project.clusters[name].gpus_per_node)
        requirements = (project.root / venv.requirements).read_text() if venv.requirements else None
        return venv.torch, venv.index, list(venv.packages), requirements

    assert declared("cpu") == ("torch==2.13.0", "https://download.pytorch.org/whl/cpu", ["tiktoken"], "numpy\n")
    # The gpu cluster's keys replace the project's; packages, which it does not set, stay.
    assert declared("gpu") == ("torch==2.12.0", CU128, ["tiktoken"], "triton\n")
    assert declared("ocean") == ("torch==2.13.0", "https://download.pytorch.org/whl/cpu", ["einops>=0.7"],
                                 "numpy\n")
    stamps = {venv_stamp(project.root, node_venv(project, c, c.gpus_per_node)) for c in project.clusters.values()}
    assert len(stamps) == 3


def test_the_preflight_asks_for_each_clusters_own_torch(index, tmp_path):  # noqa: F811
    """Real pip against a local index holding torch 2.13.0 for CPython 3.12 x86_64 only: the
    cluster that keeps the project's torch finds its wheel, the one declaring 2.99.0 is named."""
    from fatpipe.ops.env.preflight import wheel_preflight
    from fatpipe.stacks.providers import provider_for

    text = PROJECT.replace(f'torch_index = "{CU128}"', f'torch_index = "{index}"')
    text = text.replace('torch = "torch==2.12.0"', 'torch = "torch==2.99.0"')
    text += f'torch_index = "{index}"\n'
    # An x86_64 type, as the index holds (the gpu cluster's cheapest GPU type, g4dn, is one too).
    text = text.replace('[clusters.cpu]\n', '[clusters.cpu]\ninstance_type = "c5n.2xlarge"\n')
    project = project_at(tmp_path, text)
    cpu, gpu = project.cluster("cpu"), project.cluster("gpu")
    line = wheel_preflight(Cluster(project, cpu), provider_for(cpu.provider).image_python(cpu))
    assert line == f"torch wheel for Python 3.12 x86_64: {WHEEL} ({index})"
    with pytest.raises(FatpipeError) as missing:
        wheel_preflight(Cluster(project, gpu), provider_for(gpu.provider).image_python(gpu))
    assert str(missing.value).startswith(f"no wheel for torch==2.99.0 on Python 3.12 x86_64 at {index}: ")


# -- launch, over real SSH -----------------------------------------------------------------------

LAUNCH_NAME, LAUNCH_OCTET = "t-nodecl", 196
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-ncl-")  # ssh's sockets need a short path


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return declared_env_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


@pytest.fixture
def two_clusters(tmp_path, monkeypatch):
    """Cluster t-nodecl (two sim nodes over SSH, deployed) with a `[clusters.<name>.node]` of its own,
    beside a declared-only cluster; the project's index refuses every connection, so any venv build
    fails loudly."""
    require_ssh_sim()
    monkeypatch.delenv("FATPIPE_TORCH", raising=False)
    monkeypatch.delenv("FATPIPE_TORCH_INDEX_URL", raising=False)
    (tmp_path / "fatpipe.toml").write_text(ssh_sim_toml(LAUNCH_NAME, 2, LAUNCH_OCTET, f"""
[clusters.{LAUNCH_NAME}.node]
packages = ["tiktoken"]

[clusters.other]
provider = "sim"
nodes = 2
private_cidr = "10.{LAUNCH_OCTET + 1}.0.0/24"

[node]
torch = "torch==2.13.0"
torch_index = "http://10.{LAUNCH_OCTET}.0.1:9/simple"
packages = ["einops>=0.7"]
"""))
    (tmp_path / "hello.py").write_text("import numpy\nprint('numpy', numpy.__version__)\n")
    try:
        deployed = fatpipe(tmp_path, "deploy", LAUNCH_NAME, "--yes")
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        yield tmp_path
    finally:
        down = fatpipe(tmp_path, "down", LAUNCH_NAME, timeout=300)
        assert down.returncode == 0, down.stdout[-4000:]


def place_venvs(folder: Path, stamp: str) -> list[Path]:
    """Venvs fatpipe takes as built with `stamp`: a python that is this machine's interpreter."""
    outputs = json.loads((folder / ".fatpipe" / LAUNCH_NAME / "outputs.json").read_text())
    remote_dirs = [Path(n["remote_dir"]) for n in outputs["nodes"]]
    for remote_dir in remote_dirs:
        venv = remote_dir / REMOTE_VENV
        (venv / "bin").mkdir(parents=True, exist_ok=True)
        (remote_dir / PROJECT_MARKER).write_text(f"{LAUNCH_NAME}\n{project_id_at(folder)}\n")  # this project's
        (venv / ".fatpipe-stamp").write_text(stamp + "\n")
        (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (venv / "bin" / "python").chmod(0o755)
    return remote_dirs


@pytest.mark.slow
def test_launch_takes_the_venv_its_clusters_own_declaration_stamps(two_clusters):
    """Venvs stamped with the cluster's resolved declaration are current: the launch runs without a
    download. Stamped with the project's `[node]` alone (the other cluster's), they are stale: the
    launch rebuilds them and stops at the index that refuses connections, before anything starts."""
    folder = two_clusters
    project = load_project(folder / "fatpipe.toml")
    own, projects = (venv_stamp(folder, node_venv(project, project.clusters.get(name), gpus=0)) for name in (LAUNCH_NAME, "other"))
    assert own != projects
    remote_dirs = place_venvs(folder, own)
    current = fatpipe(folder, "launch", LAUNCH_NAME, "--max-restarts", "0", "--", "hello.py")
    assert current.returncode == 0, current.stdout[-4000:]
    assert "node environment (2 node(s) alike)" in current.stdout and "wheels in" not in current.stdout
    assert not (remote_dirs[0] / ".fatpipe" / "wheels").exists()

    place_venvs(folder, projects)
    stale = fatpipe(folder, "launch", LAUNCH_NAME, "--max-restarts", "0", "--", "hello.py")
    assert stale.returncode != 0 and "started run" not in stale.stdout, stale.stdout[-4000:]
    assert (remote_dirs[0] / ".fatpipe" / "wheels").exists(), stale.stdout[-4000:]  # node 0 tried the download
