"""A corpus of bad input: every case exits 2 with one `Error:` line naming the problem, prints no
traceback, and writes or changes no file."""

from __future__ import annotations

import json

import pytest

SIM = "[clusters.demo]\nprovider = \"sim\"\nisolation = \"loopback\"\n"
BARE = {"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
        "nodes": [{"name": "demo-0", "private_ip": "127.42.0.10", "transport": "local"}]}


def outputs(**change) -> str:
    doc = json.loads(json.dumps(BARE))
    doc.update(change)
    return json.dumps(doc)


def node(**change) -> str:
    return outputs(nodes=[{**BARE["nodes"][0], **change}])


# (id, fatpipe.toml text or None, {other file: text/bytes/"<dir>"}, command, words the Error line says)
CASES = [
    # -- fatpipe.toml ---------------------------------------------------------------------------
    ("toml-binary", b"\x00\xff\xfe garbage", {}, ["config"], "fatpipe.toml"),
    ("toml-empty", "", {}, ["config"], "clusters"),
    ("toml-clusters-not-a-table", "clusters = 5\n", {}, ["config"], "clusters"),
    ("nodes-a-string", SIM + "nodes = \"four\"\n", {}, ["config"], "clusters.demo.nodes"),
    ("nodes-negative", SIM + "nodes = -1\n", {}, ["config"], "clusters.demo.nodes"),
    ("nodes-enormous", SIM + "nodes = 1000000000000\n", {}, ["config"], "clusters.demo.nodes"),
    ("tier-a-number", SIM + "tier = 10\n", {}, ["config"], "clusters.demo.tier"),
    ("port-privileged", SIM + "rdzv_port = 80\n", {}, ["config"], "clusters.demo.rdzv_port"),
    ("port-too-big", SIM + "rdzv_port = 70000\n", {}, ["config"], "clusters.demo.rdzv_port"),
    ("gpus-too-many", SIM + "gpus_per_node = 99\n", {}, ["config"], "clusters.demo.gpus_per_node"),
    ("backend-unknown", SIM + "[clusters.demo.backend]\ntype = \"gcs\"\n", {}, ["config"], "backend.type"),
    ("name-non-ascii", "[clusters.\"démo\"]\nprovider = \"sim\"\n", {}, ["config"], "lowercase"),
    ("name-too-long", "[clusters.a123456789012345678901234567]\nprovider = \"sim\"\n", {}, ["config"], "24"),
    ("train-steps-zero", SIM + "[train]\nsteps = 0\n", {}, ["config"], "train.steps"),
    ("train-lr-huge", SIM + "[train]\nlr = 5.0\n", {}, ["config"], "train.lr"),
    ("train-batch-negative", SIM + "[train]\nbatch_size = -3\n", {}, ["config"], "train.batch_size"),
    ("train-seq-enormous", SIM + "[train]\nseq_len = 100000\n", {}, ["config"], "train.seq_len"),
    ("train-preset-unknown", SIM + "[train]\npreset = \"huge\"\n", {}, ["config"], "train.preset"),
    ("ssh-hosts-a-string", "[clusters.r]\nprovider = \"ssh\"\nhosts = \"a\"\n", {}, ["config"], "clusters.r.hosts"),
    ("config-a-directory", None, {"conf.toml": "<dir>"}, ["--config", "conf.toml", "config"], "conf.toml"),
    # -- outputs files ---------------------------------------------------------------------------
    ("outputs-truncated", SIM, {"o.json": outputs()[:40]}, ["wait", "--outputs", "o.json"], "o.json"),
    ("outputs-binary", SIM, {"o.json": b"\x89PNG\r\n\x1a\n"}, ["wait", "--outputs", "o.json"], "o.json"),
    ("outputs-a-directory", SIM, {"o.json": "<dir>"}, ["wait", "--outputs", "o.json"], "o.json"),
    ("outputs-no-nodes", SIM, {"o.json": outputs(nodes=[])}, ["wait", "--outputs", "o.json"], "no nodes"),
    ("outputs-no-cluster", SIM, {"o.json": json.dumps({"other": 1})}, ["wait", "--outputs", "o.json"], "cluster"),
    ("outputs-ipv6", SIM, {"o.json": node(private_ip="fe80::1")}, ["wait", "--outputs", "o.json"], "IPv6"),
    ("outputs-provider-unknown", SIM, {"o.json": outputs(provider="gcp")}, ["wait", "--outputs", "o.json"], "provider"),
    ("outputs-tier-negative", SIM, {"o.json": outputs(tier_gbps=-1)}, ["wait", "--outputs", "o.json"], "tier_gbps"),
    ("outputs-port-huge", SIM, {"o.json": outputs(rdzv_port=99999)}, ["wait", "--outputs", "o.json"], "rdzv_port"),
    ("outputs-ssh-without-address", SIM, {"o.json": node(transport="ssh")}, ["wait", "--outputs", "o.json"],
     "public_ip"),
    ("outputs-missing-file", SIM, {}, ["rendezvous", "--outputs", "nowhere.json"], "nowhere.json"),
    # -- run folders and CLI arguments ---------------------------------------------------------
    ("logs-unknown-run", SIM, {}, ["logs", "--run", "20990101-000000-dead"], "20990101-000000-dead"),
    ("report-unknown-run", SIM, {}, ["report", "--run", "nope"], "nope"),
    ("status-unknown-cluster", SIM, {}, ["status", "nosuch"], "nosuch"),
    ("down-unknown-cluster", SIM, {}, ["down", "dmeo"], "dmeo"),
    ("up-wait-timeout-zero", SIM, {}, ["up", "--wait-timeout", "0"], "--wait-timeout"),
    ("netcheck-size-junk", SIM, {}, ["netcheck", "--max-size", "12Q"], "--max-size"),
    ("netcheck-timeout-zero", SIM, {}, ["netcheck", "--timeout", "0"], "--timeout"),
    ("up-netcheck-timeout-junk", SIM, {}, ["up", "--netcheck-timeout", "soon"], "--netcheck-timeout"),
    ("netcheck-fraction-above-one", SIM, {}, ["netcheck", "--min-fraction", "2"], "--min-fraction"),
    ("train-steps-negative", SIM, {}, ["train", "--steps", "-5"], "--steps"),
    ("train-data-missing", SIM, {}, ["train", "--data", "/nonexistent/corpus"], "/nonexistent/corpus"),
    ("catalog-unknown-provider", SIM, {}, ["catalog", "gcp"], "gcp"),
    ("init-unknown-provider", None, {}, ["init", "--provider", "gcp"], "gcp"),
    ("deploy-unknown-engine", SIM, {}, ["deploy", "--engine", "pulumi"], "pulumi"),
    ("rendezvous-no-processes", SIM, {"o.json": outputs()}, ["rendezvous", "--outputs", "o.json", "--nproc-per-node", "0"],
     "--nproc-per-node"),
    ("config-extra-argument", SIM, {}, ["config", "demo", "surplus"], "surplus"),
]


def snapshot(folder) -> dict[str, tuple[int, int]]:
    found = {}
    for path in sorted(folder.rglob("*")):
        stat = path.stat()
        found[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns) if path.is_file() else (-1, 0)
    return found


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line_exit_2_nothing_written(case, run_cli, project_dir):
    _, toml, files, command, words = case
    if toml is not None:
        (project_dir / "fatpipe.toml").write_bytes(toml if isinstance(toml, bytes) else toml.encode())
    for name, content in files.items():
        path = project_dir / name
        if content == "<dir>":
            path.mkdir()
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = snapshot(project_dir)
    result = run_cli(*command)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1 and words in errors[0], result.output
    assert "Traceback" not in result.output
    assert snapshot(project_dir) == before, "a file was written or changed"


def test_the_corpus_is_large():
    assert len(CASES) >= 40


def test_a_train_only_file_works_with_fatpipe_train(run_cli, project_dir, monkeypatch):
    """`[train]` alone is enough for `fatpipe train` (it needs no cluster)."""
    (project_dir / "fatpipe.toml").write_text("[train]\npreset = \"tiny\"\nsteps = 3\n")
    calls = []
    monkeypatch.setattr("subprocess.Popen", lambda argv, **kw: calls.append(argv) or FakeProc())
    result = run_cli("train", "--run-dir", "r")
    assert result.exit_code == 0, result.output
    assert "--steps" in calls[0] and calls[0][calls[0].index("--steps") + 1] == "3"
    assert calls[0][calls[0].index("--preset") + 1] == "tiny"


class FakeProc:
    def wait(self):
        return 0
