"""`[clusters.<name>.node]`: a cluster's own keys replace the project's `[node]` keys for its nodes
only, and every consumer (the stamp, launch's venv build, `fatpipe config`) takes the cluster's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import REMOTE_VENV
from fatpipe.infra.nodespec import cluster_node
from fatpipe.infra.nodevenv import node_venv, venv_stamp
from fatpipe.infra.project import Project, parse_project
from fatpipe.ops.reach.cluster import Cluster

CU128 = "https://download.pytorch.org/whl/cu128"
TWO_CLUSTERS = """\
[clusters.cpu]
provider = "sim"
nodes = 2

[clusters.gpu]
provider = "sim"
nodes = 2
private_cidr = "10.43.0.0/24"
{gpu_node}
[node]
torch = "torch==2.13.0"
packages = ["einops>=0.7", "tiktoken"]
"""
GPU_NODE = f'[clusters.gpu.node]\ntorch = "torch==2.12.0"\ntorch_index = "{CU128}"\n'


def project(root: Path, gpu_node: str = GPU_NODE) -> Project:
    return Project(parse_project(TWO_CLUSTERS.format(gpu_node=gpu_node), "fatpipe.toml"), root, root / "fatpipe.toml")


def test_a_cluster_replaces_the_keys_it_sets_and_keeps_the_others(tmp_path):
    spec = project(tmp_path).spec
    gpu = cluster_node(spec, "gpu")
    assert (gpu.torch, gpu.torch_index) == ("torch==2.12.0", CU128)
    assert gpu.packages == ["einops>=0.7", "tiktoken"]  # not set there: the project's
    cpu = cluster_node(spec, "cpu")  # no table of its own: the project's, whole
    assert cpu == spec.node and (cpu.torch, cpu.torch_index) == ("torch==2.13.0", None)
    # A list is one key: the cluster's replaces the project's (an empty one clears it).
    cleared = cluster_node(project(tmp_path, "[clusters.gpu.node]\npackages = []\n").spec, "gpu")
    assert (cleared.packages, cleared.torch) == ([], "torch==2.13.0")


def test_the_resolved_venv_of_each_cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("FATPIPE_TORCH_INDEX_URL", raising=False)
    both = project(tmp_path)
    gpu, cpu = node_venv(both, both.clusters.get("gpu"), gpus=0), node_venv(both, both.clusters.get("cpu"), gpus=0)
    assert (gpu.torch, gpu.index, gpu.packages) == ("torch==2.12.0", CU128, ("einops>=0.7", "tiktoken"))
    assert (cpu.torch, cpu.index) == ("torch==2.13.0", "https://download.pytorch.org/whl/cpu")


def test_a_bad_cluster_node_key_is_one_line_naming_its_table(tmp_path):
    bad = {
        'torch = "numpy==2.0"': "clusters.gpu.node.torch: 'numpy==2.0' does not name torch",
        'packages = ["numpy; rm -rf ~"]': "clusters.gpu.node.packages: 'numpy; rm -rf ~' is not a requirement",
        'requirements = "../secrets.txt"': "clusters.gpu.node.requirements: requirements = '../secrets.txt'",
        'torch_index = "file:///tmp/x"': "clusters.gpu.node.torch_index: torch_index = 'file:///tmp/x' is not",
        'pakages = []': "clusters.gpu.node.pakages: unknown key; did you mean packages?",
    }
    for line, expected in bad.items():
        with pytest.raises(FatpipeError) as caught:
            project(tmp_path, f"[clusters.gpu.node]\n{line}\n")
        message = str(caught.value)
        assert message.startswith("fatpipe.toml: ") and expected in message and "\n" not in message, (line, message)
    # `node = 4` in a cluster is `nodes` mistyped, and said so.
    with pytest.raises(FatpipeError) as caught:
        parse_project('[clusters.gpu]\nprovider = "sim"\nnode = 4\n', "fatpipe.toml")
    assert "clusters.gpu.node: 4 is not a table" in str(caught.value) and "did you mean nodes?" in str(caught.value)


def test_a_missing_requirements_file_names_the_table_that_declared_it(tmp_path):
    (tmp_path / "base.txt").write_text("einops\n")
    declared = project(tmp_path, '[clusters.gpu.node]\nrequirements = "gpu.txt"\n')
    with pytest.raises(FatpipeError) as caught:
        node_venv(declared, declared.clusters.get("gpu"), gpus=0)
    assert str(caught.value).startswith("[clusters.gpu.node] requirements = 'gpu.txt': no such file")
    assert node_venv(declared, declared.clusters.get("cpu"), gpus=0).requirements is None  # the other cluster is not touched


def test_a_change_to_one_cluster_changes_only_its_stamp(tmp_path):
    def stamps(gpu_node: str) -> tuple[str, str]:
        both = project(tmp_path, gpu_node)
        return tuple(venv_stamp(tmp_path, node_venv(both, both.clusters.get(name), gpus=0)) for name in ("cpu", "gpu"))

    cpu, gpu = stamps(GPU_NODE)
    assert cpu != gpu
    changed_cpu, changed_gpu = stamps(GPU_NODE + 'packages = ["tiktoken"]\n')
    assert changed_cpu == cpu and changed_gpu != gpu  # only the gpu cluster's nodes rebuild
    assert stamps("") == (cpu, cpu)  # without a table of its own: the project's venv, the same stamp


def test_launch_builds_the_venv_its_cluster_declares(tmp_path, monkeypatch):
    from fatpipe.ops.run import prepare

    built = {}
    monkeypatch.setattr(prepare, "build_node_envs",
                        lambda nodes, venv, stamp, log: built.update(venv=venv, stamp=stamp))
    both = project(tmp_path)
    node = SimpleNamespace(rdzv=SimpleNamespace(cluster="gpu"), transport=SimpleNamespace(shares_fs=False),
                           plan=SimpleNamespace(python=f"{REMOTE_VENV}/bin/python"))
    prepare.prepare_envs(Cluster(both, both.clusters["gpu"], log=print), [node], 0)
    assert built["venv"] == node_venv(both, both.clusters.get("gpu"), gpus=0) and built["venv"].torch == "torch==2.12.0"
    assert built["stamp"] == venv_stamp(tmp_path, built["venv"])


def test_config_shows_each_clusters_node_environment(run_cli, project_dir):
    (project_dir / "fatpipe.toml").write_text(TWO_CLUSTERS.format(gpu_node=GPU_NODE))
    result = run_cli("config", "--json")
    assert result.exit_code == 0, result.output
    clusters = json.loads(result.output)["clusters"]
    assert clusters["gpu"]["node"] == {"packages": ["einops>=0.7", "tiktoken"], "requirements": None,
                                       "torch": "torch==2.12.0", "torch_index": CU128}
    assert clusters["cpu"]["node"]["torch"] == "torch==2.13.0" and clusters["cpu"]["node"]["torch_index"] is None
