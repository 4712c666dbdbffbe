"""`fatpipe data push|verify` on a sim cluster reached over SSH: once over the uplink, then node to node.

Three sim nodes with an sshd each (`transport = "ssh"`, network namespaces on a bridge), each
with its own project folder. The dataset is a git-ignored folder, so the project sync never
carries it: `data push` sends it once over node 0's ssh session, and `trainer.staging.stage` chains
its chunks over the private links to the others as they land. Chunks are 1 MiB here.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import fatpipe_cli, require_ssh_sim, ssh_sim_toml

pytestmark = pytest.mark.slow

CLUSTER, OCTET, NODES = "stg", 74, 3
CHUNK = 1 << 20
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-stg-")
FILES = {"train.bin": 3 * CHUNK + 4321, "val.bin": 100_000, "meta/vocab.txt": 17}
JOB = """\
import hashlib, os, pathlib
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
data = pathlib.Path(os.environ["FATPIPE_DATA"])
sha = hashlib.sha256((data / "train.bin").read_bytes()).hexdigest()
ranks = torch.ones(1)
dist.all_reduce(ranks)  # every rank is there before any leaves
print(f"rank {dist.get_rank()} of {ranks.item():g} data={data} sha={sha[:16]}", flush=True)
dist.destroy_process_group()
"""


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A deployed 3-node sim cluster over SSH and a project with a git-ignored data folder."""
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("stage")
    (folder / "fatpipe.toml").write_text(ssh_sim_toml(CLUSTER, NODES, OCTET, """\
link_gbps = 0.1             # slow enough to interrupt a push half way

[data]
source = "data/set"
chunk_mib = 1
"""))
    (folder / ".gitignore").write_text("data/\n")
    (folder / "job.py").write_text(JOB)
    for name, size in FILES.items():
        path = folder / "data" / "set" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    deployed = fatpipe(folder, "deploy", CLUSTER)
    assert deployed.returncode == 0, deployed.stdout
    try:
        yield folder
    finally:
        down = fatpipe(folder, "down", CLUSTER, timeout=300)
        assert down.returncode == 0, down.stdout


def node_data(folder: Path, index: int) -> Path:
    outputs = json.loads((folder / ".fatpipe" / CLUSTER / "outputs.json").read_text())
    return Path(outputs["nodes"][index]["remote_dir"]) / "data" / "set"


def push(folder: Path) -> subprocess.CompletedProcess:
    done = fatpipe(folder, "data", "push", CLUSTER, "--remote-python", sys.executable)
    assert done.returncode == 0, done.stdout[-5000:]
    return done


def same_as_source(folder: Path, index: int) -> bool:
    return all((node_data(folder, index) / name).read_bytes() == (folder / "data" / "set" / name).read_bytes()
               for name in FILES)


def test_a_gitignored_folder_reaches_every_node_and_verifies(cluster):
    folder = cluster
    first = push(folder)
    total = sum(FILES.values())
    assert f"{total} bytes" in first.stdout and f"{2 * total} byte(s) moved node to node" in first.stdout
    for i in range(NODES):
        assert same_as_source(folder, i), f"node {i} does not hold the data"
        manifest = json.loads((node_data(folder, i) / ".fatpipe-manifest.json").read_text())
        chunks = {f["name"]: len(f["chunks"]) for f in manifest["files"]}
        assert manifest["total_bytes"] == total and chunks == {"meta/vocab.txt": 1, "train.bin": 4, "val.bin": 1}
    verify = fatpipe(folder, "data", "verify", CLUSTER, "--remote-python", sys.executable)
    assert verify.returncode == 0 and verify.stdout.count("matches") == NODES, verify.stdout
    again = push(folder)  # nothing changed: no uplink copy, no chain
    assert "already on node 0" in again.stdout and "nothing to fan out" in again.stdout, again.stdout

    launch = fatpipe(folder, "launch", CLUSTER, "--max-restarts", "0", "--remote-python", sys.executable,
                     "--", "job.py")
    assert launch.returncode == 0, launch.stdout[-5000:]
    sha = hashlib.sha256((folder / "data" / "set" / "train.bin").read_bytes()).hexdigest()[:16]
    for i in range(NODES):
        assert f"data={node_data(folder, i)} sha={sha}" in launch.stdout, launch.stdout[-5000:]


def test_a_corrupted_chunk_is_found_launch_refuses_and_push_moves_only_it(cluster):
    folder = cluster
    push(folder)
    with open(node_data(folder, 2) / "train.bin", "r+b") as f:
        f.seek(CHUNK + 7)
        byte = f.read(1)
        f.seek(CHUNK + 7)
        f.write(bytes([byte[0] ^ 0xFF]))
    verify = fatpipe(folder, "data", "verify", CLUSTER, "--remote-python", sys.executable)
    assert verify.returncode == 1, verify.stdout
    assert f"{CLUSTER}-2: data/set/train.bin: chunk 1 differs from the manifest" in verify.stdout

    launch = fatpipe(folder, "launch", CLUSTER, "--max-restarts", "0", "--remote-python", sys.executable,
                     "--", "job.py")
    errors = [line for line in launch.stdout.splitlines() if line.startswith("Error:")]
    assert launch.returncode != 0 and " sha=" not in launch.stdout, launch.stdout  # nothing started
    assert len(errors) == 1 and f"node {CLUSTER}-2: data/set/train.bin: chunk 1" in errors[0], launch.stdout

    fixed = push(folder)
    assert f"{CHUNK} byte(s) moved node to node" in fixed.stdout, fixed.stdout
    assert same_as_source(folder, 2)


def test_an_interrupted_push_resumes_with_what_each_node_holds(cluster):
    folder = cluster
    push(folder)
    train = node_data(folder, 1) / "train.bin"
    # Node 1 was cut off after its first chunk of train.bin; node 2 had nothing yet; node 0 got
    # half of train.bin (its first chunk whole).
    data = train.read_bytes()
    train.unlink()
    (train.parent / "train.bin.fatpipe-partial").write_bytes(data[:CHUNK + 100])
    subprocess.run(["rm", "-rf", str(node_data(folder, 2))], check=True)
    with open(node_data(folder, 0) / "train.bin", "r+b") as f:
        f.truncate(len(data) // 2)

    resumed = push(folder)
    # Only what node 0 lacks crosses the uplink: train.bin past its first chunk.
    assert f"({FILES['train.bin'] - CHUNK} bytes)" in resumed.stdout, resumed.stdout
    moved = sum(FILES.values()) + (FILES["train.bin"] - CHUNK)  # node 2: everything; node 1: the rest
    assert f"{moved} byte(s) moved node to node" in resumed.stdout, resumed.stdout
    for i in range(NODES):
        assert same_as_source(folder, i)
    assert not list(node_data(folder, 1).glob("*.fatpipe-partial"))


def test_up_stages_what_a_node_lacks_before_it_launches(cluster):
    folder = cluster
    push(folder)
    (node_data(folder, 1) / "val.bin").unlink()
    up = fatpipe(folder, "up", CLUSTER, "--netcheck", "off", "--max-restarts", "0", "--remote-python",
                 sys.executable, "--", "job.py", timeout=900)
    assert up.returncode == 0, up.stdout[-5000:]
    report = json.loads(next((folder / ".fatpipe" / CLUSTER / "runs").glob("*/up.json")).read_text())
    phases = {p["name"]: p for p in report["phases"]}
    assert phases["deploy"]["state"] == "skipped" and phases["data"]["state"] == "done"
    assert phases["data"]["note"] == f"{sum(FILES.values())} bytes; {FILES['val.bin']} moved node to node"
    assert same_as_source(folder, 1) and f"data={node_data(folder, 1)} sha=" in up.stdout
    # job.py does not use fatpipe's API: the summary says how to get one, not a table of dashes.
    assert "job.py recorded no steps for fatpipe" in up.stdout and "final loss" not in up.stdout


def test_a_push_interrupted_half_way_resumes_where_it_stopped(cluster):
    folder = cluster
    push(folder)
    size = 48 * CHUNK  # about 4 s per link at 0.1 Gbit/s: Ctrl-C lands well before the end
    (folder / "data" / "set" / "big.bin").write_bytes(os.urandom(size))
    env = {**os.environ, "COLUMNS": "200", "FATPIPE_SSH_CONTROL_DIR": CONTROL_DIR}
    first = subprocess.Popen([sys.executable, "-m", "fatpipe.cli", "data", "push", CLUSTER, "--remote-python",
                              sys.executable], cwd=folder, env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    partial = node_data(folder, 2) / "big.bin.fatpipe-partial"
    deadline = time.monotonic() + 600
    while first.poll() is None and time.monotonic() < deadline:
        written = partial.stat().st_blocks * 512 if partial.exists() else 0  # a sparse file: what came
        if CHUNK <= written < size // 4:
            first.send_signal(signal.SIGINT)  # Ctrl-C while node 2 holds part of the file
            break
        time.sleep(0.02)
    out = first.communicate(timeout=300)[0]
    assert first.returncode != 0, "the push ended before it could be interrupted:\n" + out[-3000:]
    assert "interrupted" in out and partial.exists() and not (node_data(folder, 2) / "big.bin").exists(), out[-3000:]

    resumed = push(folder)
    moved = int(resumed.stdout.split(" byte(s) moved node to node")[0].split()[-1])
    assert moved < 2 * size, resumed.stdout  # what node 2 already held did not travel again
    assert (node_data(folder, 2) / "big.bin").read_bytes() == (folder / "data" / "set" / "big.bin").read_bytes()
    assert not partial.exists()
