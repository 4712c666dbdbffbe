"""`fatpipe synth` in-process and the cdktf CLI's `cdktf synth`, on the example with every provider."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import skip_or_fail

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "all-providers.toml"


def example_project(folder: Path) -> list[str]:
    """Copy the example into `folder` with a freshly written public key; returns its clusters."""
    key = folder / "id_ed25519.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyForSynthesisOnly test@fatpipe\n")
    text = EXAMPLE.read_text().replace('"~/.ssh/id_ed25519.pub"', json.dumps(str(key)))
    (folder / "fatpipe.toml").write_text(text)
    return list(tomllib.loads(text)["clusters"])


def test_example_declares_one_cluster_per_provider():
    clusters = tomllib.loads(EXAMPLE.read_text())["clusters"]
    assert sorted(c["provider"] for c in clusters.values()) == ["aws", "digitalocean", "sim"]


def test_synth_prints_machines_bandwidth_price_and_paths(run_cli, project_dir):
    names = example_project(project_dir)
    result = run_cli("synth", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["cluster"]: r for r in json.loads(result.output)["clusters"]}
    assert sorted(rows) == sorted(names)
    assert (rows["aws"]["machine"], rows["aws"]["baseline_gbps"], rows["aws"]["tier"]) == ("c7gn.xlarge", 12.5, "10g")
    # Machines plus, per node, a public IPv4 address and detailed monitoring.
    assert rows["aws"]["usd_per_hour"] == pytest.approx(4 * (0.2496 + 0.005 + 0.00288), abs=1e-4)
    assert rows["do"]["machine"] == "s-2vcpu-4gb" and rows["do"]["usd_per_hour"] > 0
    assert rows["local"]["usd_per_hour"] == 0
    for name, row in rows.items():
        assert (project_dir / row["json"]).is_file()
        assert row["json"] == f"cdktf.out/stacks/{name}/cdk.tf.json"

    table = run_cli("synth", "aws")
    assert table.exit_code == 0, table.output
    for text in ("c7gn.xlarge", "12.5", "10g", "1.03", "cdktf.out/stacks/aws/cdk.tf.json", "2025-06",
                 "public IPv4 address"):
        assert text in table.output


def test_synth_refuses_a_type_below_the_tier_before_building_anything(run_cli, project_dir):
    example_project(project_dir)
    config = project_dir / "fatpipe.toml"
    config.write_text(config.read_text().replace('tier = "10g"', 'tier = "10g"\ninstance_type = "c5.large"', 1))
    result = run_cli("synth", "aws")
    assert result.exit_code == 2
    assert "c5.large has 0.75 Gbit/s baseline" in result.output and "c7gn.xlarge qualifies" in result.output
    assert not (project_dir / "cdktf.out").exists()


def cdktf_cli() -> str | None:
    local = REPO / ".tools" / "node_modules" / ".bin" / "cdktf"
    return str(local) if local.exists() else shutil.which("cdktf")


@pytest.mark.slow
def test_cdktf_cli_synth_writes_every_stack(tmp_path):
    cli = cdktf_cli()
    if cli is None:
        skip_or_fail("the cdktf CLI is not installed (make cdktf-cli)")
    names = example_project(tmp_path)
    shutil.copy(REPO / "cdktf.json", tmp_path / "cdktf.json")
    # cdktf.json runs `python3 -m fatpipe.stacks`: this interpreter's, so the project is importable.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               CHECKPOINT_DISABLE="1", CDKTF_DISABLE_TELEMETRY="1")
    env.pop("FATPIPE_CONFIG", None)
    proc = subprocess.run([cli, "synth"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for name in names:
        stack = tmp_path / "cdktf.out" / "stacks" / name / "cdk.tf.json"
        assert stack.is_file(), f"no {stack}"
        doc = json.loads(stack.read_text())
        assert list(doc["output"]) == ["cluster"]
    aws = json.loads((tmp_path / "cdktf.out" / "stacks" / "aws" / "cdk.tf.json").read_text())
    assert aws["terraform"]["backend"]["s3"]["use_lockfile"] is True
    assert str(tmp_path) not in json.dumps(aws["terraform"])  # no absolute paths baked in
