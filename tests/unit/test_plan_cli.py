"""`fatpipe plan` end to end: the seed's job (8 nodes, GPT-2 124M, 1 vs 10 Gbit/s), the
catalogs ranked by time and by cost, the marks, and bad input as one line."""

from __future__ import annotations

import json


def plans(run_cli, *args: str) -> dict:
    result = run_cli("plan", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_seeds_job_on_1_and_10_gbit_links(run_cli):
    doc = plans(run_cli, "--nodes", "8", "--model", "124m", "--link", "1", "--link", "10")
    assert doc["job"]["steps"] == 19_074 and 124e6 < doc["job"]["params"] < 125e6
    rows = {p["link_gbps"]: p for p in doc["plans"]}
    assert set(rows) == {1.0, 10.0} and {p["nodes"] for p in doc["plans"]} == {8}
    slow, fast = rows[1.0], rows[10.0]
    # Plain DDP: ~7 s per step at 1 Gbit/s against ~0.9 s at 10; auto compresses at 1 Gbit/s.
    assert slow["plain_step_s"] > 5 * fast["plain_step_s"]
    assert slow["method"] not in ("none", "bf16", "fp16")
    assert slow["step_s"] < slow["plain_step_s"] / 5
    assert slow["ring_bytes"] == fast["ring_bytes"] == 2 * 7 / 8 * 4 * doc["job"]["params"]
    assert slow["tier"] == "1g" and fast["tier"] == "10g" and slow["dollars"] is None


def test_the_catalogs_ranked_by_time_and_by_cost(run_cli):
    by_time = plans(run_cli, "--nodes", "8", "--catalog", "aws", "--top", "50")["plans"]
    by_cost = plans(run_cli, "--nodes", "8", "--catalog", "aws", "--by", "cost", "--top", "50")["plans"]
    assert {p["provider"] for p in by_time} == {"aws"}
    costs = [p["dollars"] for p in by_cost]
    assert costs == sorted(costs)
    assert by_time[0]["step_s"] < by_cost[0]["step_s"] and by_time[0]["dollars"] > costs[0]
    # Burst-only types are marked: their baseline is under half the advertised rate.
    assert any(p["burst_only"] for p in by_cost)
    assert all(p["link_gbps"] <= p["baseline_gbps"] for p in by_time)


def test_the_table_marks_flows_that_cannot_reach_the_tier(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the whole table, whatever terminal runs the tests
    # A CPU node trains over gloo, one flow per peer: AWS caps it at 10 Gbit/s, under 25g.
    result = run_cli("plan", "--accelerator", "cpu", "--catalog", "aws", "--tier", "25g",
                     "--nodes", "4", "--top", "3", "--tokens", "1M")
    assert result.exit_code == 0, result.output
    assert "ranked by time" in result.output and "flow-capped" in result.output
    assert "10 of " in result.output  # the link column: 10 Gbit/s of a larger baseline


def test_bad_input_is_one_line_and_a_non_zero_exit(run_cli):
    for args, words in [(("--nodes", "1"), "--nodes"), (("--model", "huge"), "not a count"),
                        (("--top", "0"), "--top"), (("--steps", "0"), "--steps"),
                        (("--tokens", "1B", "--steps", "3"), "not both"),
                        (("--accelerator", "cpu", "--catalog", "aws", "--tier", "25g",
                          "--tokens-per-s", "-1"), "--tokens-per-s")]:
        result = run_cli("plan", *args)
        assert result.exit_code != 0, args
        assert words in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_a_declared_cluster_with_a_netcheck_is_planned_on_its_measured_link(run_cli, project_dir,
                                                                           monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    runs = project_dir / ".fatpipe" / "demo" / "runs"  # the embedded default's 4-node cluster
    (runs / "20261201-100000").mkdir(parents=True)
    (runs / "20261201-100000" / "netcheck.json").write_text(json.dumps(
        {"busbw_gbps": 0.5, "latency_s": 0.002, "nodes": ["n0", "n1", "n2", "n3"]}))
    (runs / "20261201-110000").mkdir()
    (runs / "20261201-110000" / "netcheck.json").write_text("{not json")  # newer, damaged
    doc = plans(run_cli, "--nodes", "4", "--link", "1")
    rows = {p["provider"]: p for p in doc["plans"]}
    measured, published = rows["sim (demo)"], rows["link"]
    assert measured["link_gbps"] == 0.5 and measured["link_source"] == "netcheck 20261201-100000"
    assert measured["nodes"] == 4 and measured["plain_step_s"] > published["plain_step_s"]
    assert published["link_source"] == "catalog baseline"
    table = run_cli("plan", "--nodes", "4", "--link", "1")
    assert "measured" in table.output and "sim (demo)" in table.output
    # 0.5 Gbit/s measured on a 1g cluster: below its tier, and marked so.
    assert measured["tier_unreachable"] and "below tier" in table.output


AWS_FILE = """[clusters.east]
provider = "aws"
region = "eu-west-1"
nodes = 2
tier = "1g"
ssh_public_key = "{key}"
ssh_cidr = "198.51.100.7/32"

[train]
preset = "tiny"
"""


def test_write_adds_the_best_catalog_row_to_the_cluster_file(run_cli, project_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(project_dir))  # no ~/.ssh/id_ed25519.pub of the real user
    key = project_dir / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITest test\n")
    toml = project_dir / "fatpipe.toml"
    toml.write_text(AWS_FILE.format(key=key))
    doc = plans(run_cli, "--nodes", "8", "--catalog", "aws", "--by", "cost", "--link", "1",
                "--write", "cheap")
    best = doc["written"]
    # The --link row has no price, so by cost it ranks last: the best row is a catalog one.
    assert best["provider"] == "aws" and best["machine"] == doc["plans"][0]["machine"]
    from fatpipe.infra.project import load_project

    project = load_project(str(toml))
    cheap = project.clusters["cheap"]
    assert (cheap.instance_type, cheap.nodes, cheap.tier) == (best["machine"], 8, best["tier"])
    assert (cheap.region, cheap.ssh_cidr, cheap.ssh_public_key) == ("eu-west-1", "198.51.100.7/32", str(key))
    assert project.train.preset == "tiny"  # the rest of the file as it was
    # Refused, and the file untouched: a name already declared, a bad name, a cluster that would
    # not validate (DigitalOcean's default key file does not exist under this HOME).
    before = toml.read_bytes()
    for args, words in [(("--catalog", "aws", "--write", "cheap"), "already declares"),
                        (("--catalog", "aws", "--write", "Bad name"), "not a cluster name"),
                        (("--catalog", "digitalocean", "--accelerator", "cpu", "--write", "sea"),
                         "public key file")]:
        result = run_cli("plan", "--nodes", "2", *args)
        assert result.exit_code != 0 and words in result.output, result.output
        assert toml.read_bytes() == before
    assert not list(project_dir.glob(".fatpipe.toml.*"))  # no temporary file left behind
