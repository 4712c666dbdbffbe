"""`down` of an `ssh` cluster removes only what fatpipe made, over real SSH.

The machines are sim nodes with an sshd each (as in test_ssh_provider.py); the `ssh` cluster
lists them as rented VPS. One host's project folder already holds a user's file: the first push
there is refused and the file survives `down`; the other host's folder, which fatpipe made and
marked, is removed by `down`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fatpipe.infra.node import PROJECT_MARKER

from .conftest import fatpipe_cli, free_port, rented_sim_toml

pytestmark = pytest.mark.slow

HOSTS, RENTED = "dsafe-hosts", "dsafe-rented"
OCTET = 253
NODES = 2
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-ds-")
USER_FILE = "notes.txt"


def write_project(folder: Path, remote: Path) -> None:
    """The project in `folder`; the hosts' project folders below `remote`, outside it (the nodes
    share this machine's files: inside, every push would copy the other nodes' folders too)."""
    remote_dirs = [f"{remote}/node-{i}" for i in range(NODES)]
    (folder / "fatpipe.toml").write_text(rented_sim_toml(folder, HOSTS, RENTED, OCTET, remote_dirs, rdzv_port=free_port()))
    (folder / "hello.py").write_text("print('hello')\n")


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


def contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def rented_machines(needs_netns, needs_ssh, tmp_path):
    """The project folder and the folder below which the hosts' project folders lie."""
    project, remote = tmp_path / "project", tmp_path / "fatpipe"
    project.mkdir()
    write_project(project, remote)
    deployed = fatpipe(project, "deploy", HOSTS)
    assert deployed.returncode == 0, deployed.stdout
    try:
        yield project, remote
    finally:
        fatpipe(project, "down", RENTED, timeout=300)
        down = fatpipe(project, "down", HOSTS, timeout=300)
        assert down.returncode == 0, down.stdout


def test_down_removes_only_the_folder_fatpipe_made(rented_machines):
    folder, remote = rented_machines
    ours, theirs = remote / "node-0", remote / "node-1"
    theirs.mkdir(parents=True)
    (theirs / USER_FILE).write_text("the user's own\n")
    deployed = fatpipe(folder, "deploy", RENTED)
    assert deployed.returncode == 0, deployed.stdout[-4000:]

    # The first push into a folder that is not fatpipe's is refused, naming the node and the folder.
    launched = fatpipe(folder, "launch", RENTED, "--remote-python", sys.executable, "--", "hello.py")
    assert launched.returncode != 0, launched.stdout[-4000:]
    errors = [line for line in launched.stdout.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1 and f"{RENTED}-1" in errors[0] and str(theirs) in errors[0], launched.stdout[-4000:]
    assert "not made by fatpipe" in errors[0]
    assert contents(theirs) == {USER_FILE: "the user's own\n"}
    # The other host's folder is fatpipe's: made, marked, and the mark survives the push's --delete.
    project_id = (folder / ".fatpipe" / "project-id").read_text().strip()
    assert (ours / PROJECT_MARKER).read_text() == f"{RENTED}\n{project_id}\n"
    assert (ours / "hello.py").is_file()

    down = fatpipe(folder, "down", RENTED, timeout=300)
    assert down.returncode == 0, down.stdout[-4000:]
    assert not ours.exists(), "down kept the folder fatpipe made"
    assert contents(theirs) == {USER_FILE: "the user's own\n"}, "down touched a folder fatpipe did not make"
