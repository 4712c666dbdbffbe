"""A node's project folder is one project's, and a push never deletes what a run wrote there.

Two sim machines with an sshd each (as in test_down_safe.py), declared as an `ssh` cluster `pj-lab`
by project A; a second checkout, project B, declares a cluster of the same name on the same hosts
and folders. A's script writes checkpoints and an `out/` beside its code, neither git-ignored nor
pulled: the next launch (a `--resume`) finds them on both nodes, while a file deleted here is
removed there. B is refused before anything is pushed, and B's `down` leaves A's folders whole.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fatpipe.infra.node import PROJECT_MARKER
from fatpipe.infra.project import project_id_at

from .conftest import fatpipe_cli, free_port, rented_sim_toml, require_ssh_sim

pytestmark = pytest.mark.slow

HOSTS, CLUSTER, OCTET, NODES = "pj-hosts", "pj-lab", 220, 2
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-pj-")
JOB = """\
import os, pathlib, sys
ckpt = pathlib.Path("ckpt")  # the working directory is the node's project folder
if "--resume" in sys.argv and not list(ckpt.glob("step-*.pt")):
    print("nothing to resume from", flush=True)
    sys.exit(4)
ckpt.mkdir(exist_ok=True)
step = len(list(ckpt.glob("step-*.pt"))) + 1
(ckpt / f"step-{step}.pt").write_bytes(os.urandom(2000))
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/model.safetensors").write_bytes(b"weights %d" % step)
print(f"wrote ckpt/step-{step}.pt", flush=True)
"""


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    done = fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)
    print(f"$ fatpipe {' '.join(args)} -> {done.returncode}\n{done.stdout[-4000:]}")
    return done


def launch(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return fatpipe(folder, "launch", CLUSTER, "--max-restarts", "0", "--remote-python", sys.executable, "--", *args)


def contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """(project A, the folder below which the hosts' project folders lie); `pj-lab` deployed."""
    require_ssh_sim()
    base = tmp_path_factory.mktemp("nodefolder")
    project, remote = base / "a", base / "fatpipe"
    project.mkdir()
    remote_dirs = [str(remote / f"node-{i}") for i in range(NODES)]
    (project / "fatpipe.toml").write_text(
        rented_sim_toml(project, HOSTS, CLUSTER, OCTET, remote_dirs, rdzv_port=free_port()))
    (project / "job.py").write_text(JOB)
    (project / "helper.py").write_text("HELP = 1\n")
    try:
        for cluster in (HOSTS, CLUSTER):
            deployed = fatpipe(project, "deploy", cluster)
            assert deployed.returncode == 0, deployed.stdout
        yield project, remote
    finally:
        fatpipe(project, "down", CLUSTER, timeout=300)
        down = fatpipe(project, "down", HOSTS, timeout=300)
        assert down.returncode == 0, down.stdout


def test_a_push_keeps_what_the_run_wrote_and_removes_what_left_the_project(hosts):
    project, remote = hosts
    first = launch(project, "job.py")
    assert first.returncode == 0, first.stdout[-4000:]
    for i in range(NODES):
        assert (remote / f"node-{i}" / "ckpt" / "step-1.pt").is_file()
    (project / "helper.py").unlink()  # left the project; the run never touched it
    (project / "job.py").write_text(JOB + "# edited\n")

    resumed = launch(project, "job.py", "--resume")
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    said = " ".join(resumed.stdout.split())  # rich folds long lines
    for i in range(NODES):
        there = remote / f"node-{i}"
        assert sorted(p.name for p in (there / "ckpt").iterdir()) == ["step-1.pt", "step-2.pt"], i
        assert (there / "out" / "model.safetensors").read_bytes() == b"weights 2"
        assert not (there / "helper.py").exists(), f"node {i} kept a file deleted here"
        assert (there / "job.py").read_text().endswith("# edited\n")
    assert said.count("removed 1 file(s) (helper.py)") == NODES

    # Node 1's folder as an earlier fatpipe marked it (the cluster's name alone): no proof it is
    # this project's, so nothing is pushed into it, and the line says what makes it so.
    marker = remote / "node-1" / PROJECT_MARKER
    project_id = (project / ".fatpipe" / "project-id").read_text().strip()
    marker.write_text(f"{CLUSTER}\n")
    (project / "job.py").write_text(JOB + "# edited again\n")
    try:
        refused = launch(project, "job.py", "--resume")
        said = " ".join(refused.stdout.split())
        assert refused.returncode != 0 and "without a project id" in said and f"add {project_id} as" in said, said
        assert marker.read_text() == f"{CLUSTER}\n"
        assert (remote / "node-1" / "job.py").read_text().endswith("# edited\n")
    finally:
        marker.write_text(f"{CLUSTER}\n{project_id}\n")  # as the line says


def test_a_second_project_with_a_cluster_of_the_same_name_is_refused_everywhere(hosts, tmp_path):
    a, remote = hosts
    a_id = (a / ".fatpipe" / "project-id").read_text().strip()
    b = tmp_path / "b"
    b.mkdir()
    toml = rented_sim_toml(a, HOSTS, CLUSTER, OCTET, [str(remote / f"node-{i}") for i in range(NODES)],
                           rdzv_port=free_port())
    (b / "fatpipe.toml").write_text(toml[toml.index(f"[clusters.{CLUSTER}]"):])
    (b / "job.py").write_text("print('project B')\n")
    assert fatpipe(a, "launch", CLUSTER, "--remote-python", sys.executable, "--", "job.py").returncode == 0
    for i in range(NODES):  # what A's runs wrote, whatever ran before
        (remote / f"node-{i}" / "ckpt" / "from-a.pt").write_bytes(b"A's checkpoint")
    before = {i: contents(remote / f"node-{i}") for i in range(NODES)}

    b_id = project_id_at(b)  # B's own identity, as its first command makes it
    assert a_id != b_id
    deployed = fatpipe(b, "deploy", CLUSTER)
    assert deployed.returncode == 0, deployed.stdout
    refused = launch(b, "job.py")
    assert refused.returncode != 0
    errors = [line for line in refused.stdout.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1, refused.stdout[-4000:]
    assert f"of project {a_id}" in errors[0] and f"not to this project ({b_id}, cluster '{CLUSTER}')" in errors[0]
    assert str(remote / "node-") in errors[0] and f"{CLUSTER}-" in errors[0]
    assert {i: contents(remote / f"node-{i}") for i in range(NODES)} == before

    down = fatpipe(b, "down", CLUSTER, "--verbose", timeout=300)  # -v: the provisioners' own lines
    assert down.returncode == 0, down.stdout
    assert " ".join(down.stdout.split()).count(f"it belongs to cluster '{CLUSTER}' of project {a_id}, not to "
                                               f"this project ({b_id})") == NODES
    assert {i: contents(remote / f"node-{i}") for i in range(NODES)} == before
    outputs = json.loads((a / ".fatpipe" / CLUSTER / "outputs.json").read_text())
    assert [n["remote_dir"] for n in outputs["nodes"]] == [str(remote / f"node-{i}") for i in range(NODES)]
