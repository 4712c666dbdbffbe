"""Every string of a DigitalOcean stack is valid Terraform, checked by the real terraform without its provider.

No DigitalOcean provider can be installed offline, so `terraform validate` cannot read the stack
itself. Its strings can still be judged: with the stack's own references (`${each.key}`,
`${digitalocean_vpc.vpc.id}`, ...) replaced by a placeholder, each one becomes a `locals` entry
of a provider-free stub, which terraform validates as the template it would read. Only references
to what the stack declares are replaced: any other `${...}` is left for terraform to refuse. A
public key whose comment is Terraform syntax proves that `fatpipe.stacks.literals.literal` escapes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import skip_or_fail

from fatpipe.infra.project import Project, parse_project
from fatpipe.stacks.engine import QUIET_ENV

# A reference: `${...}` not escaped as `$${...}`.
REFERENCE = re.compile(r"(?<!\$)\$\{([^}]*)\}")
PLACEHOLDER = "REF"
HOSTILE_COMMENT = "${evil} %{ if true }x%{ endif }"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKUPMq1MBSgnMg/WBrmBqrcViA6UoQJiPBGYT01EdQUy"

CLUSTERS = """
[clusters.hostile]
provider = "digitalocean"
region = "nyc3"
nodes = 3
ssh_public_key = "{hostile_key}"
ssh_cidr = "198.51.100.7/32"

[clusters.named-key]
provider = "digitalocean"
region = "fra1"
nodes = 2
tier = "10g"
private_cidr = "10.60.0.0/24"
ssh_public_key = "{plain_key}"
ssh_cidr = "198.51.100.0/28"
ssh_key_fingerprint = "a2:65:0a:3d:b4:cc:fd:30:70:c4:6a:b4:5b:9b:38:bd"
[clusters.named-key.backend]
type = "s3"
bucket = "state-bucket"
region = "eu-central-1"
"""


@pytest.fixture(scope="module")
def terraform() -> str:
    path = shutil.which("terraform")
    if not path:
        skip_or_fail("terraform not found")
    return path


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    root = tmp_path_factory.mktemp("do-strings")
    (root / "hostile.pub").write_text(f"{PUBLIC_KEY} {HOSTILE_COMMENT}\n")
    (root / "plain.pub").write_text(f"{PUBLIC_KEY} sea@test\n")
    text = CLUSTERS.format(hostile_key=root / "hostile.pub", plain_key=root / "plain.pub")
    return Project(parse_project(text, "test"), root, root / "fatpipe.toml")


@pytest.fixture(scope="module")
def stacks(project) -> dict[str, dict]:
    from fatpipe.stacks.app import build_stack
    from fatpipe.stacks.toolkit import Testing

    app = Testing.app()
    return {name: json.loads(Testing.synth(build_stack(app, cluster, project)))
            for name, cluster in project.clusters.items()}


def strings(node) -> list[str]:
    """Every string in a stack's JSON, object keys included, except cdktf's "//" metadata."""
    if isinstance(node, dict):
        found = []
        for key, value in node.items():
            if key != "//":
                found += [key, *strings(value)]
        return found
    if isinstance(node, list):
        return [text for item in node for text in strings(item)]
    return [node] if isinstance(node, str) else []


def own_references(doc: dict) -> re.Pattern:
    """What the stack's intended references start with: its resources, its locals, each, toset()."""
    declared = [f"{kind}.{name}" for kind, named in doc.get("resource", {}).items() for name in named]
    declared += [f"local.{name}" for name in doc.get("locals", {})]
    alternatives = "|".join(re.escape(d) for d in declared) or "(?!)"  # (?!): matches nothing
    return re.compile(rf"^(?:(?:{alternatives})(?:[.\[]|$)|each\.(?:key|value)$|toset\()")


def placeheld(text: str, own: re.Pattern) -> str:
    """`text` with each of the stack's own references replaced by the placeholder."""
    return REFERENCE.sub(lambda m: PLACEHOLDER if own.match(m.group(1)) else m.group(0), text)


def stub(folder: Path, texts: list[str], own: re.Pattern, outputs: bool = False) -> Path:
    """A provider-free configuration holding `texts` as locals (and as outputs, to read them back)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {f"s{i}": placeheld(text, own) for i, text in enumerate(texts)}
    doc: dict = {"locals": names}
    if outputs:
        doc["output"] = {name: {"value": f"${{local.{name}}}"} for name in names}
    (folder / "main.tf.json").write_text(json.dumps(doc, indent=1))
    return folder


def tf(terraform: str, folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([terraform, f"-chdir={folder}", *args], capture_output=True, text=True,
                          env={**os.environ, **QUIET_ENV}, timeout=120)


def validate(terraform: str, folder: Path) -> dict:
    init = tf(terraform, folder, "init", "-input=false", "-no-color")
    assert init.returncode == 0, init.stderr
    return json.loads(tf(terraform, folder, "validate", "-json", "-no-color").stdout)


@pytest.mark.parametrize("name", ["hostile", "named-key"])
def test_every_string_of_the_stack_is_a_valid_terraform_template(stacks, terraform, tmp_path, name):
    texts, own = strings(stacks[name]), own_references(stacks[name])
    references = {ref for text in texts for ref in REFERENCE.findall(text)}
    assert {"each.key", "digitalocean_vpc.vpc.id", "local.user_data"} <= references
    assert all(own.match(ref) for ref in references), sorted(references)  # nothing else looks like one
    result = validate(terraform, stub(tmp_path, texts, own))
    assert result["valid"], json.dumps(result["diagnostics"], indent=1)


def test_the_hostile_key_comment_is_escaped_and_would_fail_unescaped(stacks, project, terraform, tmp_path):
    doc, cluster = stacks["hostile"], project.cluster("hostile")
    written = doc["resource"]["digitalocean_ssh_key"]["key"]["public_key"]
    assert cluster.public_key.endswith(HOSTILE_COMMENT) and written != cluster.public_key
    texts, own = strings(doc), own_references(doc)
    assert validate(terraform, stub(tmp_path / "escaped", texts, own))["valid"]
    # The same stack with the key as the user wrote it: terraform reads `${evil}` as a reference.
    raw = [cluster.public_key if text == written else text for text in texts]
    result = validate(terraform, stub(tmp_path / "raw", raw, own))
    assert not result["valid"]
    assert [d["summary"] for d in result["diagnostics"]] == ["Invalid reference"]
    assert "${evil}" in result["diagnostics"][0]["snippet"]["code"]


def test_terraform_reads_the_escaped_key_back_as_written(stacks, project, terraform, tmp_path):
    """Applied (locals and outputs need no provider), the escaped key is the key, to the letter."""
    written = stacks["hostile"]["resource"]["digitalocean_ssh_key"]["key"]["public_key"]
    # Unescaped, the directive alone is valid but evaluated: it would reach DigitalOcean as "x".
    folder = stub(tmp_path, [written, "%{ if true }x%{ endif }"], own_references({}), outputs=True)
    assert tf(terraform, folder, "init", "-input=false", "-no-color").returncode == 0
    applied = tf(terraform, folder, "apply", "-auto-approve", "-input=false", "-no-color")
    assert applied.returncode == 0, applied.stderr
    values = json.loads(tf(terraform, folder, "output", "-json").stdout)
    assert values["s0"]["value"] == project.cluster("hostile").public_key
    assert values["s1"]["value"] == "x"
