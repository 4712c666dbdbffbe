"""`fatpipe data push` where the nodes share this machine's files: the data lands in the user's own
project folder, so a push deletes only what its record says it staged there, writes over no file
of the user's, and refuses a `path` that holds its source.

Two netns sim nodes without ssh (their project folder is this one). An HTTPS server with a private
CA listens on this machine's address on the cluster's bridge, as a store on the internet would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import netns_available, skip_or_fail
from dataservers import https_server

from .conftest import fatpipe_cli, free_port

pytestmark = pytest.mark.slow

CLUSTER, OCTET, NODES = "dpo", 191, 2
HOST = f"10.{OCTET}.0.1"  # this machine on the cluster's bridge
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-dpo-")
TOML = (f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = {NODES}\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "10.{OCTET}.0.0/24"\nrdzv_port = {free_port()}\n')


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("Error:")]


def declare(folder: Path, data: str) -> None:
    (folder / "fatpipe.toml").write_text(TOML + "\n[data]\n" + data)


def held(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` but fatpipe's own, by its relative path."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".fatpipe-" not in p.name}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A deployed 2-node netns sim cluster whose nodes share this project folder."""
    if not netns_available():
        skip_or_fail("needs root and `ip netns`")
    if not shutil.which("terraform") or not shutil.which("rsync"):
        skip_or_fail("needs terraform and rsync on PATH")
    from fatpipe.stacks.sim.net import link_names, sweep_cluster
    from fatpipe.stacks.sim.sshd import host_address

    folder = tmp_path_factory.mktemp("ownfiles")
    (folder / "fatpipe.toml").write_text(TOML)
    (folder / ".gitignore").write_text("data/\nraw/\n")
    try:
        deployed = fatpipe(folder, "deploy", CLUSTER)
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        host_address(link_names(CLUSTER, 0)["bridge"], f"{HOST}/24")  # gone with the bridge at `down`
        yield folder
    finally:
        down = fatpipe(folder, "down", CLUSTER, timeout=300)
        sweep_cluster(CLUSTER, folder / ".fatpipe" / CLUSTER / "nodes")
        assert down.returncode == 0, down.stdout[-4000:]


def test_a_push_deletes_only_what_it_staged_and_never_its_source(cluster):
    folder = cluster
    data = folder / "data"
    (data / "raw").mkdir(parents=True)
    (data / "notes.txt").write_text("the user's notes")
    (data / "raw" / "a.bin").write_bytes(b"a" * 5000)
    mine = held(data)

    # The reproduction: the path holds the source. Refused, nothing touched.
    declare(folder, 'source = "data/raw"\npath = "data"\n')
    refused = fatpipe(folder, "data", "push", CLUSTER)
    assert refused.returncode == 2 and len(errors(refused)) == 1, refused.stdout[-3000:]
    assert "data path 'data' holds the source 'data/raw'" in errors(refused)[0]
    assert held(data) == mine

    raw = folder / "raw"
    raw.mkdir()
    for name in ("a.bin", "b.bin"):
        (raw / name).write_bytes(name.encode() * 3000)
    declare(folder, 'source = "raw"\npath = "data"\nchunk_mib = 1\n')
    first = fatpipe(folder, "data", "push", CLUSTER)
    assert first.returncode == 0 and "removed" not in first.stdout, first.stdout[-3000:]
    assert held(data) == {**mine, "a.bin": (raw / "a.bin").read_bytes(), "b.bin": (raw / "b.bin").read_bytes()}

    # The source drops a file: the push removes that staged copy alone; verify names nothing of the user's.
    (raw / "b.bin").unlink()
    second = fatpipe(folder, "data", "push", CLUSTER)
    assert second.returncode == 0, second.stdout[-3000:]
    assert f"{CLUSTER}-0: removed 1 file(s) the manifest does not list from data: b.bin" in second.stdout
    assert held(data) == {**mine, "a.bin": (raw / "a.bin").read_bytes()}
    verify = fatpipe(folder, "data", "verify", CLUSTER)
    assert verify.returncode == 0 and verify.stdout.count("matches") == NODES, verify.stdout[-3000:]

    # A file of the user's where a data file goes: one line, nothing written.
    (data / "c.bin").write_bytes(b"the user's c.bin")
    (raw / "c.bin").write_bytes(b"the source's c.bin")
    blocked = fatpipe(folder, "data", "push", CLUSTER)
    assert blocked.returncode == 2 and len(errors(blocked)) == 1, blocked.stdout[-3000:]
    assert "data holds 1 file(s) fatpipe did not stage where the data goes: c.bin" in errors(blocked)[0]
    assert (data / "c.bin").read_bytes() == b"the user's c.bin"
    assert json.loads((data / ".fatpipe-staged.json").read_text())["files"] == ["a.bin"]


def test_an_https_file_lands_beside_the_users_files_never_over_one(cluster, tmp_path):
    folder = cluster
    body = b"w" * 70_000
    web, ca = https_server(tmp_path, HOST, free_port(), {"/sets/train.bin": body})
    try:
        (folder / "certs").mkdir(exist_ok=True)
        (folder / "certs" / "ca.pem").write_bytes(ca.read_bytes())
        web_dir = folder / "web"
        web_dir.mkdir()
        (web_dir / "notes.txt").write_text("the user's")
        (web_dir / "train.bin").write_bytes(b"the user's own train.bin")
        declare(folder, f'source = "https://{HOST}:{web.server_address[1]}/sets/train.bin"\n'
                        'path = "web/train.bin"\nchunk_mib = 1\nca_bundle = "certs/ca.pem"\n')
        refused = fatpipe(folder, "data", "push", CLUSTER)
        assert refused.returncode != 0 and len(errors(refused)) == 1, refused.stdout[-3000:]
        assert "web/train.bin is a file fatpipe did not stage; nothing was written" in errors(refused)[0]
        assert held(web_dir) == {"notes.txt": b"the user's", "train.bin": b"the user's own train.bin"}

        (web_dir / "train.bin").unlink()
        done = fatpipe(folder, "data", "push", CLUSTER)
        assert done.returncode == 0, done.stdout[-3000:]
        assert held(web_dir) == {"notes.txt": b"the user's", "train.bin": body}
    finally:
        web.stop()
