"""Runs you can find: only a launched run becomes the latest, status and logs fall back to the newest
run with logs, a run's outcome is read from its folder after `down`, `fatpipe runs` lists and prunes."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runinfo import list_runs, prune_runs, run_info
from fatpipe.infra.runs import find_run, latest_run_id, mark_latest, new_run
from fatpipe.ops.rdzv.rendezvous import new_rendezvous
from fatpipe.ops.reach.cluster import Cluster


@pytest.fixture(autouse=True)
def ids_in_order(monkeypatch):
    """Run ids sort by the second they were made in; these tests make several in one second."""
    import itertools

    from fatpipe.infra import runs

    counter = itertools.count()
    monkeypatch.setattr(runs, "new_run_id", lambda: f"20250101-000000-{next(counter):04x}")


def outputs(transport: str = "local"):
    nodes = []
    for i in range(2):
        node = {"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": transport}
        if transport == "netns":  # namespaces that do not exist: a cluster after `down`
            node.update(private_ip=f"10.42.0.{10 + i}", netns=f"fp-t-gone-{i}")
        nodes.append(node)
    return parse_outputs({"name": "demo", "provider": "sim", "tier_gbps": 1,
                          "private_cidr": "10.42.0.0/24", "nodes": nodes})


def a_run(project, transport: str = "local", exits=(), steps: int = 0, summary: dict | None = None):
    run_id, run_dir = new_run(project, "demo")
    new_rendezvous(Cluster(project, outputs=outputs(transport)), run_id, run_dir)
    for rank, code in enumerate(exits):
        (run_dir / f"node-{rank}.log").write_text(f"node {rank} says hi\n")
        (run_dir / f"node-{rank}.exit").write_text(f"{code}\n")
    if steps:
        records = [{"step": s, "loss": 6.0 - s / 10} for s in range(1, steps + 1)]
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n{\"step\": 9")
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_id, run_dir


def test_a_new_run_is_not_the_latest_until_launched(project_dir):
    project = load_project()
    trained, _ = a_run(project, exits=(0, 0))
    mark_latest(project, "demo", trained)
    new_run(project, "demo")  # a netcheck's or a refused up's folder
    assert latest_run_id(project, "demo") == trained
    assert find_run(project, "demo")[0] == trained


def test_without_a_usable_mark_the_newest_run_with_logs_is_found(project_dir):
    project = load_project()
    with pytest.raises(FatpipeError, match="has no runs yet"):
        find_run(project, "demo")
    with_logs, _ = a_run(project, exits=(0, 0))
    a_run(project)  # written, never launched
    _, netcheck_only = new_run(project, "demo")
    (netcheck_only / "netcheck").mkdir()
    assert find_run(project, "demo")[0] == with_logs  # no mark at all (an older fatpipe's folder)
    mark_latest(project, "demo", netcheck_only.name)  # a mark on a run that never trained
    assert find_run(project, "demo")[0] == with_logs
    (project.state_dir("demo") / "runs" / "latest").write_bytes(b"\xff\x00garbage")
    assert find_run(project, "demo")[0] == with_logs


@pytest.mark.parametrize("text", ["", '{"run_id": "x", "nodes": [', "[]", '{"nodes": 3}', "\xff\xfe"])
def test_a_corrupt_rendezvous_is_one_line_exit_2(project_dir, run_cli, text):
    project = load_project()
    run_id, run_dir = a_run(project, exits=(0, 0))
    mark_latest(project, "demo", run_id)
    (run_dir / "rendezvous.json").write_text(text, errors="surrogateescape")
    with pytest.raises(FatpipeError) as caught:
        find_run(project, "demo")
    assert caught.value.exit_code == 2 and str(run_dir / "rendezvous.json") in str(caught.value)
    for command in (["logs"], ["stop"], ["launch", "--run", run_id]):
        if command[0] == "launch":
            (project.state_dir("demo") / "outputs.json").write_text(outputs().model_dump_json())
        result = run_cli(*command)
        assert result.exit_code == 2, (command, result.output)
        assert result.output.startswith("Error: ") and "rendezvous.json: unreadable" in result.output
        assert "Traceback" not in result.output
    status = run_cli("status")  # read-only: still answers, and names the problem
    assert status.exit_code == 0 and "rendezvous.json: unreadable" in " ".join(status.output.split())


def test_outcome_steps_and_loss_come_from_the_folder(project_dir):
    project = load_project()
    _, ok = a_run(project, exits=(0, 0), steps=6, summary={"steps": 6, "final_loss": 1.25})
    _, failed = a_run(project, exits=(0, 1), steps=3)
    _, stopped = a_run(project, exits=(143, 143), steps=2)
    _, never = new_run(project, "demo")
    infos = {i.path: i for i in list_runs(project, "demo")}
    assert (infos[ok].outcome, infos[ok].last_step, infos[ok].final_loss) == ("ok", 6, 1.25)
    assert (infos[failed].outcome, infos[failed].last_step) == ("failed (exit 1)", 3)
    assert infos[failed].final_loss == pytest.approx(5.7)  # the last whole record, not the cut one
    assert infos[stopped].outcome == "stopped"
    assert infos[never].outcome == "never launched"
    assert all(i.size_bytes > 0 for i in infos.values() if i.path != never)


def test_status_logs_and_stop_after_down_tell_the_recorded_outcome(project_dir, run_cli):
    project = load_project()
    run_id, _ = a_run(project, transport="netns", exits=(0, 1), steps=6)
    mark_latest(project, "demo", run_id)
    status = run_cli("status")
    assert status.exit_code == 0, status.output
    text = " ".join(status.output.split())
    assert "not deployed" in text and "demo-0: exit 0" in text and "demo-1: exit 1" in text
    assert "unreachable" not in text and "last step 6" in text
    doc = json.loads(run_cli("status", "--json").output)
    assert doc["run"]["outcome"] == "failed (exit 1)" and doc["run"]["last_step"] == 6
    # A failed run's logs end as its followed launch did: the failure line and its exit status.
    for follow in ([], ["-f"]):
        logs = run_cli("logs", *follow)
        assert logs.exit_code == 1 and "demo-1 | node 1 says hi" in logs.output, logs.output
        assert "error: demo-1 failed first: exit status 1" in " ".join(logs.output.split()), logs.output
    assert "gone" in logs.output
    stop = run_cli("stop")
    assert stop.exit_code == 0 and "is not deployed" in stop.output and "failed (exit 1)" in stop.output


def test_runs_lists_and_prunes(project_dir, run_cli):
    project = load_project()
    ids = []
    for steps in (2, 3, 4):
        run_id, run_dir = a_run(project, exits=(0, 0), steps=steps)
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "step-1.pt").write_bytes(b"x" * 50_000)
        ids.append(run_id)
    mark_latest(project, "demo", ids[0])  # the latest is never pruned, however old
    listing = run_cli("runs")
    assert listing.exit_code == 0, listing.output
    assert f"{ids[0]} *" in listing.output and "ok" in listing.output and "KiB" in listing.output
    doc = json.loads(run_cli("runs", "demo", "--json").output)
    assert [r["steps"] for r in doc] == [2, 3, 4] and [r["latest"] for r in doc] == [True, False, False]

    result = run_cli("runs", "prune", "--keep", "1", "--checkpoints")
    assert result.exit_code == 0 and "removed checkpoints of 1 run(s)" in result.output, result.output
    runs = project.state_dir("demo") / "runs"
    assert not (runs / ids[1] / "checkpoints").exists() and (runs / ids[1] / "metrics.jsonl").exists()
    assert (runs / ids[0] / "checkpoints").exists() and (runs / ids[2] / "checkpoints").exists()

    result = run_cli("runs", "prune", "demo", "--keep", "1")
    assert result.exit_code == 0 and "removed 1 run(s)" in result.output, result.output
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == [ids[0], ids[2]]
    assert prune_runs(project, "demo", 0, spare={ids[2]}) == []  # latest and running are kept
    assert run_info(runs / ids[2]).outcome == "ok"


def test_a_refused_script_leaves_no_run_and_moves_nothing(project_dir, run_cli):
    project = load_project()
    run_id, _ = a_run(project, exits=(0, 0))
    mark_latest(project, "demo", run_id)
    (project.state_dir("demo") / "outputs.json").write_text(outputs().model_dump_json())
    result = run_cli("launch", "--", "no_such_script.py")
    assert result.exit_code == 1 and "no_such_script.py: no such script" in result.output
    assert latest_run_id(project, "demo") == run_id
    assert [p.name for p in (project.state_dir("demo") / "runs").iterdir() if p.is_dir()] == [run_id]


def test_runs_pull_takes_cluster_and_run(project_dir, run_cli):
    project = load_project()
    run_id, _ = a_run(project, exits=(0, 0))
    mark_latest(project, "demo", run_id)
    shared = run_cli("runs", "pull", "demo", "latest")
    assert shared.exit_code == 0 and f"run {run_id}: its nodes share this machine's files" in shared.output
    assert run_cli("runs", "pull", run_id).exit_code == 0
    extra = run_cli("runs", "pull", "demo", run_id, "more")
    assert extra.exit_code == 2 and "runs pull takes [CLUSTER] RUN" in extra.output
    missing = run_cli("runs", "pull", "demo", "20990101-000000-beef")
    assert missing.exit_code == 2 and "no run 20990101-000000-beef" in missing.output
