"""The CLI skeleton: instant help, version, init, and the packaging that installs it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fatpipe.infra.project import load_project
from fatpipe.infra.templates import TEMPLATES

REPO = Path(__file__).resolve().parents[2]
HEAVY_MODULES = ("torch", "cdktf", "cdktn", "imports.aws", "cdktf_cdktf_provider_aws", "cdktn_provider_aws",
                 "pydantic", "boto3")


def test_help_imports_nothing_heavy():
    # The start-up time itself is measured by bench/startup.py, not by a timed test.
    code = (
        "import sys\n"
        "from fatpipe.cli.main import cli\n"
        "try: cli(['--help'])\nexcept SystemExit: pass\n"
        f"heavy=[m for m in {HEAVY_MODULES!r} if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out, out


def test_version(run_cli):
    result = run_cli("--version")
    assert result.exit_code == 0 and result.output.startswith("fatpipe, version ")


@pytest.mark.parametrize("provider", sorted(TEMPLATES))
def test_init_writes_a_valid_commented_file(run_cli, project_dir, provider):
    result = run_cli("init", "--provider", provider)
    assert result.exit_code == 0, result.output
    text = (project_dir / "fatpipe.toml").read_text()
    assert text.startswith("# fatpipe.toml")
    if provider == "sim":
        assert load_project().cluster().name == "demo"


def test_init_refuses_to_overwrite(run_cli, project_dir):
    (project_dir / "fatpipe.toml").write_text("# mine\n")
    result = run_cli("init")
    assert result.exit_code == 2 and "--force" in result.output
    assert (project_dir / "fatpipe.toml").read_text() == "# mine\n"
    assert run_cli("init", "--force").exit_code == 0
    assert "[clusters.demo]" in (project_dir / "fatpipe.toml").read_text()


def test_wheel_holds_the_four_packages(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True,
    )
    wheel = next(tmp_path.glob("fatpipe-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("infra", "stacks", "cli", "trainer"):
        assert f"fatpipe/{package}/__init__.py" in names, names
    assert not any(n.startswith(("infra/", "cli/", "trainer/", "stacks/", "tests/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "fatpipe = fatpipe.cli.main:cli" in zipfile.ZipFile(wheel).read(entry_points).decode()
