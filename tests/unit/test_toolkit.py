"""The toolkit seam: FATPIPE_TOOLKIT picks cdktf or cdktn, a wrong or missing one is one line, and
no stack module reaches a CDK core except through the seam."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.stacks import toolkit

REPO = Path(__file__).resolve().parents[2]
# Modules only stacks/toolkit.py may import: the cores and their prebuilt bindings.
CDK_MODULES = ("cdktf", "cdktn", "constructs", "cdktf_cdktf_provider_", "cdktn_provider_")


@pytest.fixture
def fresh(monkeypatch):
    """The seam as if this process had not chosen yet (restored afterwards)."""
    monkeypatch.setattr(toolkit, "_pinned", None)
    monkeypatch.delenv(toolkit.ENV, raising=False)
    return monkeypatch


@pytest.mark.parametrize("value,name", [(None, "cdktf"), ("", "cdktf"), ("cdktf", "cdktf"),
                                        ("cdktn", "cdktn"), (" CDKTN ", "cdktn")])
def test_the_default_is_cdktf_and_the_variable_picks(value, name):
    assert toolkit.select(value).name == name


def test_an_unknown_toolkit_is_one_line_naming_the_allowed():
    with pytest.raises(ConfigError) as e:
        toolkit.select("terraform")
    assert str(e.value) == "FATPIPE_TOOLKIT='terraform' is no toolkit; allowed: cdktf, cdktn"
    assert e.value.exit_code == 2


def test_a_missing_toolkit_is_one_line_saying_how_to_install_it():
    kit = toolkit.Toolkit("cdktn", "CDK Terrain", "fatpipe_no_such_core", "x", "x-dist", "pip install 'fatpipe[cdktn]'")
    with pytest.raises(FatpipeError) as e:
        toolkit._load(kit, kit.core, "cdktn")
    assert str(e.value) == "FATPIPE_TOOLKIT=cdktn but cdktn is not installed: pip install 'fatpipe[cdktn]'"
    assert "\n" not in str(e.value)


def test_a_broken_toolkit_is_not_reported_as_missing(tmp_path, monkeypatch):
    (tmp_path / "brokenkit").mkdir()
    (tmp_path / "brokenkit" / "__init__.py").write_text("import fatpipe_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kit = toolkit.Toolkit("cdktn", "t", "brokenkit", "x", "x", "install")
    with pytest.raises(ModuleNotFoundError) as e:
        toolkit._load(kit, "brokenkit", "brokenkit")
    assert e.value.name == "fatpipe_absent_dependency"


def test_the_choice_is_fixed_at_first_use(fresh):
    fresh.setenv(toolkit.ENV, "cdktn")
    assert toolkit.chosen().name == "cdktn"
    fresh.setenv(toolkit.ENV, "cdktf")  # one app must not mix two cores' objects
    assert toolkit.chosen().name == "cdktn"


def test_report_names_the_toolkit_its_version_and_why(fresh):
    report = toolkit.report()
    assert (report["name"], report["chosen_by"]) == ("cdktf", "default")
    assert report["summary"].startswith(f"cdktf {report['version']} (CDK for Terraform, the default")
    fresh.setattr(toolkit, "_pinned", None)
    fresh.setenv(toolkit.ENV, "cdktn")
    report = toolkit.report()
    assert (report["name"], report["chosen_by"]) == ("cdktn", "FATPIPE_TOOLKIT")
    if report["version"] is None:
        assert report["summary"] == "cdktn, not installed (pip install 'fatpipe[cdktn]')"
    else:
        assert report["summary"] == f"cdktn {report['version']} (CDK Terrain, FATPIPE_TOOLKIT=cdktn)"


def test_config_reports_the_toolkit(fresh, run_cli):
    result = run_cli("config", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["toolkit"]["name"] == "cdktf"
    assert "toolkit: cdktf " in run_cli("config").output


def test_the_seam_imports_no_core_until_a_name_is_used():
    code = ("import sys\nfrom fatpipe.stacks import toolkit\ntoolkit.report()\n"
            f"print([m for m in {CDK_MODULES!r} + ('jsii',) if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_only_the_seam_imports_a_cdk_core_or_bindings():
    wrong = []
    for path in sorted((REPO / "stacks").rglob("*.py")):
        if path.name == "toolkit.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            wrong += [f"{path.relative_to(REPO)}:{node.lineno} imports {name}" for name in names
                      if name.split(".")[0] in CDK_MODULES or name.startswith(CDK_MODULES[3:])]
    assert not wrong, "\n".join(wrong)


def test_every_core_name_exists_in_both_toolkits():
    """The seam's surface, checked in each installed core's own source (nothing is imported)."""
    import importlib.util

    for kit in toolkit.TOOLKITS.values():
        spec = importlib.util.find_spec(kit.core)
        if spec is None:
            continue
        source = Path(spec.origin).read_text()
        missing = [name for name in toolkit.CORE_NAMES if f"\nclass {name}(" not in source
                   and f"\nclass {name}:" not in source]
        assert not missing, f"{kit.core} lacks {missing}"
