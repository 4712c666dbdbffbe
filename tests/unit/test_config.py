"""The cluster file: the embedded default, valid files, and one clear line for each mistake."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra.project import load_project
from fatpipe.infra.trainspec import TrainSpec


@pytest.fixture
def pubkey(project_dir):
    path = project_dir / "id.pub"
    path.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests fatpipe@test\n")
    return path


def aws(pubkey, **overrides) -> str:
    values = {
        "provider": '"aws"', "region": '"us-east-1"', "nodes": "2", "tier": '"10g"',
        "ssh_public_key": f'"{pubkey}"', "ssh_cidr": '"203.0.113.7/32"',
    }
    values.update(overrides)
    body = "\n".join(f"{k} = {v}" for k, v in values.items() if v is not None)
    return f"[clusters.east]\n{body}\n"


def test_embedded_default_is_the_demo_cluster(project_dir):
    project = load_project()
    demo = project.cluster()
    assert (demo.name, demo.provider, demo.nodes, demo.tier) == ("demo", "sim", 4, "1g")
    assert project.path is None and project.root == project_dir
    assert demo.private_ip(0) == "10.42.0.10"


def test_config_json_shows_the_resolved_settings(run_cli, pubkey, project_dir):
    (project_dir / "fatpipe.toml").write_text(aws(pubkey) + '[train]\nsteps = 7\n')
    result = run_cli("config", "east", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["clusters"]["east"]["instance_type"] is None
    assert doc["clusters"]["east"]["region"] == "us-east-1"
    assert doc["train"]["steps"] == 7 and doc["train"]["preset"] == "small"


def test_config_table_names_every_cluster(run_cli):
    result = run_cli("config")
    assert result.exit_code == 0
    assert "cluster demo" in result.output and "preset" in result.output


def test_train_spec_becomes_trainer_flags():
    args = TrainSpec(steps=3, compile=True, data="x.txt").trainer_args()
    assert args[args.index("--steps") + 1] == "3"
    assert "--compile" in args and args[args.index("--data") + 1] == "x.txt"
    assert "--bucket-cap-mb" in args


BAD_CONFIGS = [
    # (id, file body or callable(pubkey) -> body, the key the message must name, a word it must say)
    ("nodes-zero", "[clusters.a]\nprovider='sim'\nnodes=0\n", "clusters.a.nodes", "greater than or equal to 1"),
    ("nodes-too-many", "[clusters.a]\nprovider='sim'\nnodes=513\n", "clusters.a.nodes", "512"),
    ("unknown-tier", "[clusters.a]\nprovider='sim'\ntier='40g'\n", "clusters.a.tier", "'1g'"),
    ("unknown-provider", "[clusters.a]\nprovider='gcp'\n", "clusters.a.provider", "sim, aws, digitalocean"),
    ("missing-provider", "[clusters.a]\nnodes=2\n", "clusters.a.provider", "missing"),
    ("bad-cidr", "[clusters.a]\nprovider='sim'\nprivate_cidr='10.42.0.0/33'\n", "clusters.a.private_cidr", "IPv4 network"),
    ("cidr-host-bits", "[clusters.a]\nprovider='sim'\nprivate_cidr='10.42.0.1/24'\n", "clusters.a.private_cidr", "host bits"),
    ("public-cidr", "[clusters.a]\nprovider='sim'\nprivate_cidr='8.8.8.0/24'\n", "clusters.a.private_cidr", "private range"),
    ("cidr-too-small", "[clusters.a]\nprovider='sim'\nnodes=20\nprivate_cidr='10.42.0.0/28'\n", "clusters.a", "holds at most"),
    ("ssh-open-to-world", lambda k: aws(k, ssh_cidr='"0.0.0.0/0"'), "clusters.east", "allow_ssh_from_anywhere"),
    ("ssh-cidr-bad", lambda k: aws(k, ssh_cidr='"my-laptop"'), "clusters.east.ssh_cidr", "not a network"),
    ("missing-key-file", lambda k: aws(k, ssh_public_key='"/nonexistent/id.pub"'), "clusters.east.ssh_public_key", "does not exist"),
    ("bad-aws-region", lambda k: aws(k, region='"us-middle-9"'), "clusters.east.region", "not an AWS region"),
    ("bad-do-region", lambda k: aws(k, provider='"digitalocean"', region='"mars1"'), "clusters.east.region", "nyc3"),
    ("bad-do-fingerprint", lambda k: aws(k, provider='"digitalocean"', region='"nyc3"', ssh_key_fingerprint='"abc"'), "clusters.east.ssh_key_fingerprint", "MD5"),
    ("ssh-cidr-missing", lambda k: aws(k, ssh_cidr=None), "clusters.east.ssh_cidr", "required"),
    ("duplicate-cluster", "[clusters.a]\nprovider='sim'\n[clusters.a]\nprovider='sim'\n", "clusters.a", "twice"),
    ("bad-cluster-name", "[clusters.Big_One]\nprovider='sim'\n", "clusters", "lowercase"),
    ("reserved-cluster-name", "[clusters.catalog]\nprovider='sim'\n", "clusters", "reserved"),
    ("unknown-key", "[clusters.a]\nprovider='sim'\nnods=3\n", "clusters.a.nods", "allowed: nodes"),
    ("unknown-train-key", "[clusters.a]\nprovider='sim'\n[train]\nstep=3\n", "train.step", "allowed: preset"),
    ("bad-comm", "[clusters.a]\nprovider='sim'\n[train]\ncomm='zip'\n", "train.comm", "'powersgd'"),
    ("no-clusters", "[train]\nsteps=3\n", "clusters", "required"),
    ("sim-cidr-clash", "[clusters.a]\nprovider='sim'\n[clusters.b]\nprovider='sim'\n", "clusters", "another private_cidr"),
    ("sim-loopback-clash", "[clusters.a]\nprovider='sim'\nprivate_cidr='10.16.0.0/24'\n[clusters.b]\nprovider='sim'\nprivate_cidr='172.16.0.0/24'\n", "clusters", "share addresses"),
    ("s3-without-bucket", "[clusters.a]\nprovider='sim'\n[clusters.a.backend]\ntype='s3'\n", "clusters.a.backend", "bucket"),
    ("not-toml", "[clusters.a\nprovider='sim'\n", "fatpipe.toml", "not valid TOML"),
    ("aws-cidr-too-wide", lambda k: aws(k, private_cidr='"10.0.0.0/12"'), "clusters.east", "/16 to /28"),
    ("do-cidr-too-narrow", lambda k: aws(k, provider='"digitalocean"', region='"nyc3"', private_cidr='"10.42.0.0/26"'),
     "clusters.east", "/16 to /24"),
    ("do-s3-without-region", lambda k: aws(k, provider='"digitalocean"', region='"nyc3"')
     + "[clusters.east.backend]\ntype='s3'\nbucket='b'\n", "clusters.east", "backend.region"),
    ("reserved-project-id", "[clusters.project-id]\nprovider='sim'\n", "clusters", "reserved"),
]


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_one_line_naming_the_key(case, run_cli, pubkey, project_dir):
    _, body, key, word = case
    text = body(pubkey) if callable(body) else body
    (project_dir / "fatpipe.toml").write_text(text)
    before = sorted(p.name for p in project_dir.iterdir())
    result = run_cli("config")
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1, message
    assert message.startswith("Error: fatpipe.toml:"), message
    assert key in message and word in message, message
    assert sorted(p.name for p in project_dir.iterdir()) == before  # nothing written


def test_missing_explicit_config_is_an_error(run_cli):
    result = run_cli("--config", "nowhere.toml", "config")
    assert result.exit_code == 2 and "nowhere.toml: no such file" in result.output


def test_unknown_cluster_lists_the_declared_ones(run_cli):
    result = run_cli("config", "prod")
    assert result.exit_code == 2 and "no cluster 'prod'; declared: demo" in result.output
