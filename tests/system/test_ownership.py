"""`down` removes only this project's resources; deploy and wait notice nodes that vanished; runs stay
findable: a refused `up` or a failed netcheck moves no mark, and after `down` status, logs and stop
tell how the run ended. Real CLI, real terraform, netns sim clusters."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import skip_or_fail

from fatpipe.stacks.sim import net as simnet

pytestmark = pytest.mark.slow

TRAIN = ["--preset", "tiny", "--steps", "4", "--batch-size", "4", "--seq-len", "64", "--max-restarts", "0"]


def project(folder: Path, name: str, octet: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fatpipe.toml").write_text(
        f'[clusters.{name}]\nprovider = "sim"\nnodes = 2\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "10.{octet}.0.0/24"\nrdzv_port = {29500 + octet}\n')
    return folder


def fatpipe(folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("FATPIPE_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    done.stdout = " ".join(done.stdout.split())  # rich folds long lines
    print(f"$ fatpipe {' '.join(args)}  -> {done.returncode}\n{done.stdout[-3000:]}")
    return done


@pytest.fixture
def terraform(needs_netns):
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform on PATH")


@pytest.fixture
def cleanup():
    made: list[tuple[Path, str]] = []
    yield made
    for folder, name in made:
        fatpipe(folder, "down", name, timeout=180)
        simnet.sweep_cluster(name, folder / ".fatpipe" / name / "nodes",
                             project_id=(folder / ".fatpipe" / "project-id").read_text().strip())


def test_two_projects_with_a_same_named_cluster_cannot_remove_each_others_nodes(terraform, tmp_path, cleanup):
    a, b = project(tmp_path / "a", "t-own", 71), project(tmp_path / "b", "t-own", 72)
    cleanup += [(b, "t-own"), (a, "t-own")]
    assert fatpipe(a, "deploy").returncode == 0
    a_id = (a / ".fatpipe" / "project-id").read_text().strip()

    refused = fatpipe(b, "deploy")
    assert refused.returncode != 0
    assert f"is not this project's node (it belongs to project {a_id} in {a})" in refused.stdout

    down = fatpipe(b, "down")
    assert down.returncode == 0
    assert "left alone (another project's): fp-t-own-0, fp-t-own-1" in down.stdout
    assert simnet.leftover_netns("t-own") == ["fp-t-own-0", "fp-t-own-1"]
    assert fatpipe(a, "wait", "--wait-timeout", "30").returncode == 0  # A's cluster still works

    down = fatpipe(a, "down")
    assert down.returncode == 0 and "destroyed 2 resource(s)" in down.stdout
    assert simnet.leftover_netns("t-own") == []

    typo = fatpipe(a, "down", "t-onw")
    assert typo.returncode == 2 and "no cluster 't-onw'; declared: t-own" in typo.stdout


def test_vanished_nodes_are_named_at_once_and_deploy_makes_them_again(terraform, tmp_path, cleanup):
    folder = project(tmp_path / "p", "t-gone", 73)
    cleanup.append((folder, "t-gone"))
    assert fatpipe(folder, "deploy").returncode == 0
    subprocess.run(["ip", "netns", "del", "fp-t-gone-1"], check=True, timeout=30)  # as a reboot would

    # It must not wait for a node that is gone: it answers before its own bound (600 s by default).
    bound_s = 240
    started = time.monotonic()
    wait = fatpipe(folder, "wait", "--wait-timeout", str(bound_s))
    assert wait.returncode == 1 and time.monotonic() - started < bound_s
    assert "t-gone-1: gone from this machine" in wait.stdout and "`fatpipe deploy t-gone`" in wait.stdout

    again = fatpipe(folder, "deploy")
    assert again.returncode == 0 and "t-gone-1: gone from this machine though deployed; making them again" \
        in again.stdout
    assert simnet.leftover_netns("t-gone") == ["fp-t-gone-0", "fp-t-gone-1"]
    assert fatpipe(folder, "wait", "--wait-timeout", "60").returncode == 0


def test_runs_stay_findable_and_tell_their_outcome_after_down(terraform, tmp_path, cleanup):
    folder = project(tmp_path / "p", "t-runs", 74)
    cleanup.append((folder, "t-runs"))
    runs = folder / ".fatpipe" / "t-runs" / "runs"
    first = fatpipe(folder, "up", "--netcheck", "off", *TRAIN)
    assert first.returncode == 0
    trained = (runs / "latest").read_text().strip()

    # A second `up` while one changes the cluster is refused before it makes anything.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # --on-signal stop: the SIGINT below (no terminal) stops its run instead of detaching.
    busy = subprocess.Popen([sys.executable, "-m", "fatpipe.cli", "up", "--netcheck", "off", *TRAIN[:2],
                             "--steps", "400", "--max-restarts", "0", "--on-signal", "stop"], cwd=folder,
                            env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for line in busy.stdout:
            if "started run" in line:
                break
        second = fatpipe(folder, "up", "--netcheck", "off", *TRAIN)
        assert second.returncode == 1 and "cluster t-runs is busy: `fatpipe up` (pid" in second.stdout
        assert fatpipe(folder, "status").returncode == 0  # read-only commands still answer
    finally:
        os.killpg(busy.pid, signal.SIGINT)
        busy.communicate(timeout=120)
    stopped = (runs / "latest").read_text().strip()
    assert stopped != trained  # the run that started is the latest, stopped or not

    # A failed link check trains nothing and moves nothing.
    simnet.reshape_node("t-runs", 1, 0.4)
    failed = fatpipe(folder, "up", "--netcheck", "quick", *TRAIN)
    assert failed.returncode == 1 and "netcheck failed" in failed.stdout
    assert (runs / "latest").read_text().strip() == stopped

    assert fatpipe(folder, "down").returncode == 0
    status = fatpipe(folder, "status")
    assert status.returncode == 0 and "not deployed" in status.stdout and "unreachable" not in status.stdout
    assert f"latest run {stopped}" in status.stdout and "t-runs-0: exit" in status.stdout
    logs = fatpipe(folder, "logs", "--run", trained)
    assert logs.returncode == 0 and "t-runs-0 |" in logs.stdout
    stop = fatpipe(folder, "stop")
    assert stop.returncode == 0 and "t-runs is not deployed (destroyed?): nothing runs there" in stop.stdout
    listing = json.loads(subprocess.run([sys.executable, "-m", "fatpipe.cli", "runs", "--json"], cwd=folder,
                                        capture_output=True, text=True, timeout=60).stdout)
    by_id = {r["id"]: r for r in listing}
    assert by_id[trained]["outcome"] == "ok" and by_id[trained]["steps"] == 4
    assert by_id[stopped]["latest"] and by_id[stopped]["outcome"] == "stopped"
