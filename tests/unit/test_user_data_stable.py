"""What changes with the project (its version, requirements, packages, this machine's torch) never
reaches a node's declaration: each cloud's node resource synthesizes byte for byte the same, so
the next deploy has nothing to replace. The boot tuning still does: another tier is another
node (tests/system/test_aws_emulator.py and test_deploy_replace.py apply both for real,
tests/unit/test_node_profile.py shows the tier in the user data)."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra.project import Project, parse_project

CLOUDS = {"aws": ("aws_instance", "nodes"), "digitalocean": ("digitalocean_droplet", "nodes")}


def nodes_json(tmp_path, provider: str) -> str:
    """The synthesized node resource and the locals it reads (the user data), as JSON text."""
    from fatpipe.stacks.app import build_stack
    from fatpipe.stacks.toolkit import Testing

    key = tmp_path / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyForSynthesisOnly t@t\n")
    region = "us-east-1" if provider == "aws" else "nyc3"
    text = (f'[clusters.c]\nprovider = "{provider}"\nregion = "{region}"\nnodes = 2\ntier = "10g"\n'
            f'ssh_public_key = "{key}"\nssh_cidr = "198.51.100.7/32"\n')
    project = Project(parse_project(text, "fatpipe.toml"), tmp_path, tmp_path / "fatpipe.toml")
    doc = json.loads(Testing.synth(build_stack(Testing.app(), project.clusters["c"], project)))
    rtype, name = CLOUDS[provider]
    return json.dumps({"node": doc["resource"][rtype][name], "locals": doc.get("locals")}, sort_keys=True)


@pytest.mark.parametrize("provider", list(CLOUDS))
def test_a_version_bump_new_requirements_or_another_torch_leave_every_node_as_declared(provider, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "1.0.0"\n')
    (tmp_path / "requirements.txt").write_text("einops==0.7.0\n")
    monkeypatch.setenv("FATPIPE_TORCH", "torch==2.12.0")
    before = nodes_json(tmp_path, provider)

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "1.0.1"\n')
    (tmp_path / "requirements.txt").write_text("einops==0.8.0\ntiktoken\n")
    monkeypatch.setenv("FATPIPE_TORCH", "torch==2.13.0")
    assert nodes_json(tmp_path, provider) == before
    assert "torch==" not in before and "einops" not in before
