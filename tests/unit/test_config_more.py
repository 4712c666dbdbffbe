"""Config errors all at once with "did you mean", `init --add`, and the steps <= warmup_steps warning."""

from __future__ import annotations

import json

from fatpipe.infra.project import load_project

MISTAKES = """\
[clusters.demo]
provider = "sim"
node = 3
tier = "2g"

[train]
step = 50
lr = 7
"""


def test_every_mistake_at_once_with_did_you_mean(run_cli, project_dir):
    (project_dir / "fatpipe.toml").write_text(MISTAKES)
    result = run_cli("config")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "Error: fatpipe.toml: 4 problems:"
    assert any(line.strip().startswith("train.step: unknown key; did you mean steps?") for line in lines)
    # `node` is the cluster's node environment table: a number there is `nodes` mistyped.
    assert any(line.strip().startswith("clusters.demo.node: 3 is not a table ([clusters.demo.node] is the node "
                                       "environment); did you mean nodes?") for line in lines)
    assert any("clusters.demo.tier: '2g' is not allowed" in line for line in lines)
    assert any(line.strip().startswith("train.lr:") for line in lines)


def test_no_guess_when_nothing_is_close(run_cli, project_dir):
    (project_dir / "fatpipe.toml").write_text("[clusters.demo]\nprovider = 'sim'\n[train]\nzebra = 1\n")
    result = run_cli("config")
    assert result.exit_code == 2 and "did you mean" not in result.output
    assert "train.zebra: unknown key; allowed: preset, steps" in result.output


def test_flag_mistakes_are_reported_together(run_cli, project_dir):
    result = run_cli("train", "--steps", "0", "--lr", "9")
    assert result.exit_code == 2
    assert "2 problems" in result.output and "--steps:" in result.output and "--lr:" in result.output


def test_init_add_appends_a_cluster_on_its_own_network(run_cli, project_dir):
    assert run_cli("init").exit_code == 0
    result = run_cli("init", "--add", "second")
    assert result.exit_code == 0 and "added cluster second (sim)" in result.output
    assert run_cli("init", "--add", "third", "--provider", "sim").exit_code == 0
    project = load_project()
    assert list(project.clusters) == ["demo", "second", "third"]
    cidrs = [c.private_cidr for c in project.clusters.values()]
    assert len(set(cidrs)) == 3 and cidrs[0] == "10.42.0.0/24"
    text = (project_dir / "fatpipe.toml").read_text()
    assert text.count("[train]") == 1 and "# fatpipe.toml" in text  # the comments stay

    again = run_cli("init", "--add", "second")
    assert again.exit_code == 2 and "already declares cluster 'second'" in again.output
    bad = run_cli("init", "--add", "Bad_Name")
    assert bad.exit_code == 2 and "a cluster name is lowercase" in bad.output
    assert (project_dir / "fatpipe.toml").read_text() == text


def test_init_add_a_cloud_cluster_says_what_to_fill_in(run_cli, project_dir):
    assert run_cli("init").exit_code == 0
    result = run_cli("init", "--add", "east", "--provider", "aws")
    assert result.exit_code == 0, result.output
    assert "[clusters.east]" in (project_dir / "fatpipe.toml").read_text()
    assert "edit it before deploying" in result.output and "ssh_public_key" in result.output


def test_init_add_without_a_file_writes_one(run_cli, project_dir):
    assert run_cli("init", "--add", "lab").exit_code == 0
    assert list(load_project().clusters) == ["lab"]


def test_steps_not_above_warmup_is_a_warning(run_cli, project_dir):
    (project_dir / "fatpipe.toml").write_text("[clusters.demo]\nprovider = 'sim'\n[train]\nsteps = 20\n")
    result = run_cli("config")
    assert result.exit_code == 0 and "warning: steps (20) is not above warmup_steps (20)" in result.output
    assert json.loads(run_cli("config", "--json").output)["warnings"]
    (project_dir / "fatpipe.toml").write_text("[clusters.demo]\nprovider = 'sim'\n[train]\nsteps = 21\n")
    assert "warning" not in run_cli("config").output


def test_down_refuses_a_cluster_it_does_not_know(run_cli, project_dir, monkeypatch):
    from fatpipe.cli import down
    from fatpipe.stacks import engine

    called = []
    monkeypatch.setattr(down, "destroy_cluster", lambda project, spec, name, **_: called.append(name)
                        or engine.Teardown(name))
    result = run_cli("down", "dmeo")
    assert result.exit_code == 2 and "no cluster 'dmeo'; declared: demo" in result.output
    assert "destroyed" not in result.output and called == []
    # A cluster since removed from the file, whose state is still here, can still be brought down.
    state = project_dir / ".fatpipe" / "old" / "terraform.tfstate"
    state.parent.mkdir(parents=True)
    state.write_text("{}")
    result = run_cli("down", "old")
    assert result.exit_code == 0 and called == ["old"] and "old: nothing was deployed" in result.output
