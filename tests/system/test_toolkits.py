"""Both toolkits, CDK for Terraform and CDK Terrain, write the same stacks: every variant synthesized
by `fatpipe synth` under each FATPIPE_TOOLKIT, `cdktn synth` from cdktf.json, and the generic
DigitalOcean resources checked against cdktf's prebuilt DigitalOcean bindings."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
TOOLKITS = {"cdktf": ("cdktf", "cdktf_cdktf_provider_aws"), "cdktn": ("cdktn", "cdktn_provider_aws")}
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyForSynthesisOnly ${evil} %{x} test@fatpipe"
CLOUD = 'ssh_public_key = "{key}"\nssh_cidr = "198.51.100.7/32"\n'
# Every variant whose JSON differs: the sim, each AWS tier, a GPU type, an S3 backend, an IPv6
# SSH source, DigitalOcean with and without a key on the account, and machines you already rent.
VARIANTS = {
    "sim": 'provider = "sim"\nnodes = 3\nisolation = "loopback"\n',
    "aws1g": 'provider = "aws"\nregion = "us-east-1"\nnodes = 3\ntier = "1g"\n' + CLOUD,
    "aws10g": 'provider = "aws"\nregion = "eu-west-1"\navailability_zone = "eu-west-1b"\nnodes = 4\n'
              'tier = "10g"\nbackend = { type = "s3", bucket = "tf-state", region = "eu-west-1" }\n' + CLOUD,
    "aws25g": 'provider = "aws"\nregion = "us-east-1"\nnodes = 2\ntier = "25g"\n' + CLOUD,
    "awsgpu": 'provider = "aws"\nregion = "us-east-1"\nnodes = 2\ntier = "10g"\ngpus_per_node = 1\n'
              + CLOUD.replace("198.51.100.7/32", "2001:db8::/64"),
    "do1g": 'provider = "digitalocean"\nregion = "nyc3"\nnodes = 3\ntier = "1g"\n' + CLOUD,
    "do10g": 'provider = "digitalocean"\nregion = "fra1"\nnodes = 2\ntier = "10g"\nprivate_cidr = "10.60.0.0/24"\n'
             'ssh_key_fingerprint = "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"\n' + CLOUD,
    "own": 'provider = "ssh"\ntier = "1g"\n[[clusters.own.hosts]]\naddress = "203.0.113.10"\n'
           'private_ip = "10.0.0.10"\n[[clusters.own.hosts]]\naddress = "vps2.example.net"\nport = 2222\n'
           'user = "ubuntu"\nprivate_ip = "10.0.0.11"\n',
}


def installed(name: str) -> bool:
    return all(importlib.util.find_spec(module) for module in TOOLKITS[name])


def comparable(doc):
    """The JSON without what may differ between toolkits: "//" metadata and provider versions."""
    if isinstance(doc, list):
        return [comparable(item) for item in doc]
    if not isinstance(doc, dict):
        return doc
    out = {key: comparable(value) for key, value in doc.items() if key != "//"}
    for provider in out.get("terraform", {}).get("required_providers", {}).values():
        provider.pop("version", None)
    return out


def synth_all(folder: Path, toolkit: str) -> tuple[dict, dict]:
    """`fatpipe synth --json` in a fresh process under `toolkit`: (its report, {cluster: JSON})."""
    env = dict(os.environ, FATPIPE_TOOLKIT=toolkit)
    env.pop("FATPIPE_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "fatpipe.cli", "synth", "--json"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    stacks = {name: json.loads((folder / "cdktf.out" / "stacks" / name / "cdk.tf.json").read_text())
              for name in VARIANTS}
    shutil.rmtree(folder / "cdktf.out")
    return json.loads(proc.stdout), stacks


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """{toolkit: (synth report, stacks)}, both from one project folder: the same id, the same paths."""
    missing = [name for name in TOOLKITS if not installed(name)]
    if missing:
        skip_or_fail(f"needs both toolkits; missing {', '.join(missing)} (make install-cdktn)")
    folder = tmp_path_factory.mktemp("toolkits")
    key = folder / "id.pub"
    key.write_text(PUBLIC_KEY + "\n")
    (folder / "fatpipe.toml").write_text("".join(
        f"[clusters.{name}]\n{table.replace('{key}', str(key))}\n" for name, table in VARIANTS.items()))
    return {name: synth_all(folder, name) for name in TOOLKITS}


def test_synth_reports_the_toolkit_it_used(both):
    for name, (report, _) in both.items():
        kit = report["toolkit"]
        assert (kit["name"], kit["chosen_by"]) == (name, "FATPIPE_TOOLKIT")
        assert kit["version"] == importlib.metadata.version(name)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_both_toolkits_write_the_same_stack(both, name):
    cdktf, cdktn = both["cdktf"][1][name], both["cdktn"][1][name]
    assert comparable(cdktn) == comparable(cdktf)
    # What differs is what the toolkit owns: its version in the metadata, and the AWS provider
    # release its prebuilt bindings pin. DigitalOcean's pin is fatpipe's own: the same in both.
    assert cdktf["//"]["metadata"]["version"] != cdktn["//"]["metadata"]["version"]
    versions = [{p: v.get("version") for p, v in doc["terraform"].get("required_providers", {}).items()}
                for doc in (cdktf, cdktn)]
    assert versions[0].keys() == versions[1].keys()
    if "digitalocean" in versions[0]:
        assert versions[0]["digitalocean"] == versions[1]["digitalocean"]


def test_digitalocean_attributes_are_what_the_prebuilt_bindings_write(both):
    """Each generic DigitalOcean resource, rebuilt from its JSON with cdktf's prebuilt bindings
    (attribute names and block types from the provider schema), synthesizes to the same JSON."""
    if not importlib.util.find_spec("cdktf_cdktf_provider_digitalocean"):
        skip_or_fail("cdktf-cdktf-provider-digitalocean is not installed")
    from cdktf import TerraformStack, Testing

    for name in ("do1g", "do10g"):
        ours = {kind: {key: comparable(value) for key, value in resources.items()}
                for kind, resources in both["cdktn"][1][name]["resource"].items()}
        stack = TerraformStack(Testing.app(), name)
        for kind, resources in ours.items():
            for id, attributes in resources.items():
                prebuilt(stack, kind, id, attributes)
        theirs = json.loads(Testing.synth(stack))["resource"]
        for kind, resources in ours.items():
            for id, attributes in resources.items():
                attributes.pop("for_each", None)  # a core meta-argument, not the provider's
                assert comparable(theirs[kind][id]) == attributes, f"{name}: {kind}.{id}"


def prebuilt(scope, kind: str, id: str, attributes: dict):
    """`kind` built by cdktf's prebuilt DigitalOcean class; a list of objects is a block of structs."""
    module = importlib.import_module(f"cdktf_cdktf_provider_digitalocean.{kind.removeprefix('digitalocean_')}")
    cls = getattr(module, camel(kind.removeprefix("digitalocean_")))
    args = {}
    for key, value in attributes.items():
        if key == "for_each":
            continue
        if isinstance(value, list) and value and isinstance(value[0], dict):
            struct = getattr(module, cls.__name__ + camel(key))
            value = [struct(**item) for item in value]
        args[key] = value
    return cls(scope, id, **args)


def camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def cdktn_cli() -> str | None:
    local = REPO / ".tools" / "cdktn" / "node_modules" / ".bin" / "cdktn"
    return str(local) if local.exists() else shutil.which("cdktn")


@pytest.mark.slow
def test_cdktn_cli_synth_runs_the_app_from_cdktf_json(tmp_path):
    cli = cdktn_cli()
    if cli is None or not installed("cdktn"):
        skip_or_fail("the cdktn CLI or the cdktn extra is not installed (make cdktn-cli install-cdktn)")
    example = (REPO / "examples" / "all-providers.toml").read_text()
    key = tmp_path / "id_ed25519.pub"
    key.write_text(PUBLIC_KEY + "\n")
    (tmp_path / "fatpipe.toml").write_text(example.replace('"~/.ssh/id_ed25519.pub"', json.dumps(str(key))))
    shutil.copy(REPO / "cdktf.json", tmp_path / "cdktf.json")
    # The CLI's folder first: it holds the Node >= 22 that cdktn-cli needs; then this interpreter's,
    # since cdktf.json runs `python3 -m fatpipe.stacks`.
    path = os.pathsep.join([str(Path(cli).parent), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = dict(os.environ, PATH=path, FATPIPE_TOOLKIT="cdktn", CHECKPOINT_DISABLE="1",
               CDKTF_DISABLE_TELEMETRY="1")
    env.pop("FATPIPE_CONFIG", None)
    proc = subprocess.run([cli, "synth"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for name in ("aws", "do", "local"):
        doc = json.loads((tmp_path / "cdktf.out" / "stacks" / name / "cdk.tf.json").read_text())
        assert list(doc["output"]) == ["cluster"]
        assert doc["//"]["metadata"]["version"] == importlib.metadata.version("cdktn")
    aws = json.loads((tmp_path / "cdktf.out" / "stacks" / "aws" / "cdk.tf.json").read_text())
    assert aws["terraform"]["required_providers"]["aws"]["source"] == "registry.terraform.io/hashicorp/aws"
    assert str(tmp_path) not in json.dumps(aws["terraform"])  # no absolute paths baked in
