"""deploy_cluster's gates without an engine: AWS preflight first, confirmation before spending money."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.project import load_project
from fatpipe.stacks import engine
from fatpipe.stacks.providers import aws_api, digitalocean_api

BARE = {
    "name": "{name}", "provider": "{provider}", "region": "r", "tier_gbps": 10,
    "private_cidr": "10.42.0.0/24", "ssh_user": "ubuntu", "gpus_per_node": 0, "rdzv_port": 29400,
    "nodes": [{"name": "n-0", "public_ip": "54.1.2.3", "private_ip": "10.42.0.10", "transport": "ssh"}],
}


@pytest.fixture
def cloud_project(project_dir):
    key = project_dir / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE1example test\n")
    (project_dir / "fatpipe.toml").write_text(f"""
[clusters.c-aws]
provider = "aws"
region = "us-east-1"
nodes = 2
tier = "10g"
ssh_public_key = "{key}"
ssh_cidr = "203.0.113.7/32"

[clusters.c-do]
provider = "digitalocean"
region = "fra1"
nodes = 2
ssh_public_key = "{key}"
ssh_cidr = "203.0.113.7/32"

[clusters.c-sim]
provider = "sim"
nodes = 1
isolation = "loopback"
""")
    return load_project()


@pytest.fixture
def calls(monkeypatch):
    """Record preflight and engine calls; the engine 'applies' by returning terraform's JSON."""
    seen: list[str] = []

    def preflight(cluster, *args, **kwargs):
        seen.append(f"preflight {cluster.name}")
        return cluster

    for api in (aws_api, digitalocean_api):
        monkeypatch.setattr(api, "preflight", preflight)

    class FakeRunner:
        def __init__(self, engine_name, project, name, log, cluster=None):
            self.name, self.provider = name, project.cluster(name).provider
            seen.append(f"runner {engine_name}")

        def apply(self):
            seen.append(f"apply {self.name}")
            value = json.loads(json.dumps(BARE).replace("{name}", self.name)
                               .replace("{provider}", self.provider))
            if self.provider == "sim":
                value["nodes"] = [{"name": "n-0", "private_ip": "127.42.0.10", "transport": "local",
                                   "ready_file": "/x/ready.json"}]
            return {"cluster": {"value": value, "type": ["object", {}], "sensitive": False}}

    monkeypatch.setattr(engine, "Runner", FakeRunner)
    return seen


def test_aws_runs_preflight_then_asks_and_can_be_cancelled(cloud_project, calls):
    asked = []
    with pytest.raises(FatpipeError, match="cancelled; nothing was created"):
        engine.deploy_cluster(cloud_project, cloud_project.cluster("c-aws"), confirm=lambda q: asked.append(q) or False)
    assert calls == ["preflight c-aws"]
    assert "2 aws node(s) in us-east-1" in asked[0] and "cost money" in asked[0]
    assert not engine.outputs_path(cloud_project, "c-aws").exists()


def test_failed_preflight_stops_before_the_question(cloud_project, calls, monkeypatch):
    def refuse(cluster, root=None):
        raise FatpipeError("no default VPC quota")

    monkeypatch.setattr(__import__("sys").modules["fatpipe.stacks.providers.aws_api"], "preflight", refuse)
    with pytest.raises(FatpipeError, match="quota"):
        engine.deploy_cluster(cloud_project, cloud_project.cluster("c-aws"), confirm=lambda q: pytest.fail("asked"))


def test_yes_skips_the_question_and_writes_bare_outputs(cloud_project, calls):
    out = engine.deploy_cluster(cloud_project, cloud_project.cluster("c-aws"), engine="tofu", yes=True,
                                confirm=lambda q: pytest.fail("asked"))
    assert calls == ["preflight c-aws", "runner tofu", "apply c-aws"]
    written = json.loads(engine.outputs_path(cloud_project, "c-aws").read_text())
    assert written == out.model_dump(mode="json") and written["nodes"][0]["public_ip"] == "54.1.2.3"


def test_digitalocean_runs_its_preflight_and_asks(cloud_project, calls):
    engine.deploy_cluster(cloud_project, cloud_project.cluster("c-do"), confirm=lambda q: True)
    assert calls == ["preflight c-do", "runner terraform", "apply c-do"]


def test_sim_never_asks_and_keeps_extra_node_fields(cloud_project, calls):
    out = engine.deploy_cluster(cloud_project, cloud_project.cluster("c-sim"), confirm=lambda q: pytest.fail("asked"))
    assert out.nodes[0].ready_file == "/x/ready.json"


def test_cli_deploy_answering_no_exits_nonzero(cloud_project, calls, run_cli):
    result = run_cli("deploy", "c-aws", input="n\n")
    assert result.exit_code == 1 and "cancelled" in result.output
    assert calls == ["preflight c-aws"]


def test_unknown_engine_is_refused(project_dir, monkeypatch):
    monkeypatch.setattr(engine, "_find_binary", lambda name, root: name)
    with pytest.raises(FatpipeError, match="unknown engine 'pulumi'"):
        engine.Runner("pulumi", load_project(), "demo", print)


def test_missing_engine_binary_names_the_fix(project_dir, monkeypatch):
    monkeypatch.setenv("PATH", str(project_dir))
    with pytest.raises(FatpipeError, match="tofu not found on PATH"):
        engine.Runner("tofu", load_project(), "demo", print)
