"""Changing the project never replaces a node without asking: real plans, real applies.

Sim (loopback, both engines): a tier change replaces each node and fewer nodes destroy one, each
refused without `--replace`; cdktf's deploy plans with terraform too. AWS (an in-place stop and start
refused without `--replace`, and a project's own changes touching no instance) is shown on the
emulator's cluster in tests/system/test_aws_emulator.py, which applies the real provider anyway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_or_fail

from .test_aws_emulator import digest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def fatpipe(folder: Path, env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`fatpipe ARGS` with no terminal on stdin: a question would be a refusal."""
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


# -- sim: terraform_data nodes, both engines ---------------------------------------------------------

SIM = "dp-lb"


def sim_toml(tier: str, nodes: int = 2) -> str:
    return (f'[clusters.{SIM}]\nprovider = "sim"\nnodes = {nodes}\ntier = "{tier}"\nisolation = "loopback"\n'
            f'private_cidr = "10.210.0.0/24"\n')


@pytest.mark.parametrize("engine", ["terraform", "cdktf"])
def test_sim_nodes_are_replaced_or_destroyed_only_when_asked(engine, tmp_path):
    from fatpipe.stacks.engine import CDKTF_LOCAL

    repo = Path(__file__).resolve().parents[2]
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform on PATH")
    if engine == "cdktf" and not ((repo / CDKTF_LOCAL).is_file() or shutil.which("cdktf")):
        skip_or_fail("needs the cdktf CLI (make cdktf-cli)")
    toml, env = tmp_path / "fatpipe.toml", {k: v for k, v in os.environ.items() if k != "FATPIPE_CONFIG"}
    toml.write_text(sim_toml("1g"))
    state = tmp_path / ".fatpipe" / SIM / "terraform.tfstate"
    try:
        assert fatpipe(tmp_path, env, "deploy", "--engine", engine).returncode == 0
        before = digest(state)
        ready = {p: p.read_bytes() for p in (tmp_path / ".fatpipe" / SIM / "nodes").rglob("ready*")}
        assert len(ready) == 2, ready

        toml.write_text(sim_toml("10g"))
        refused = fatpipe(tmp_path, env, "deploy", "--engine", engine)
        assert refused.returncode != 0
        assert [line for line in refused.stdout.splitlines() if line.startswith(f"{SIM}-")] == [
            f"{SIM}-{i}: replace (rate_gbit 1 -> 10, tier 1g -> 10g); holds: unknown (no run or data push recorded here)"
            for i in range(2)], refused.stdout
        assert digest(state) == before and all(p.read_bytes() == b for p, b in ready.items())
        assert not list((tmp_path / "cdktf.out").rglob("fatpipe.tfplan"))  # the refused plan is not kept

        replaced = fatpipe(tmp_path, env, "deploy", "--engine", engine, "--replace")
        assert replaced.returncode == 0, replaced.stdout + replaced.stderr
        outputs = json.loads((tmp_path / ".fatpipe" / SIM / "outputs.json").read_text())
        assert outputs["tier_gbps"] == 10

        toml.write_text(sim_toml("10g", nodes=1))
        refused = fatpipe(tmp_path, env, "deploy", "--engine", engine)
        assert refused.returncode != 0 and f"{SIM}-1: destroy (no longer declared); holds: " in refused.stdout
        assert len(json.loads((tmp_path / ".fatpipe" / SIM / "outputs.json").read_text())["nodes"]) == 2
    finally:
        toml.write_text(sim_toml("10g"))
        down = fatpipe(tmp_path, env, "down", "--engine", engine)
    assert down.returncode == 0, down.stdout + down.stderr
