"""`fatpipe data push|verify` with a remote source: every node of a sim cluster reached over SSH
fetches it itself, over its own link, nothing through this machine.

Three sim nodes with an sshd each (network namespaces on a bridge). The sources listen on this
machine's address on the bridge, as a store on the internet would for rented machines: a moto S3
server, and an HTTPS server with a private CA whose replies can stop half way. A node's AWS
credentials are its own: its Python is a wrapper that exports them, as an instance role or the
node's environment would give them; this machine's are never sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from dataservers import https_server, s3_server, write_node_python

from .conftest import fatpipe_cli, free_port, require_ssh_sim, ssh_sim_toml

pytestmark = pytest.mark.slow

CLUSTER, OCTET, NODES = "rsrc", 213, 3
HOST = f"10.{OCTET}.0.1"  # this machine on the cluster's bridge
CHUNK = 1 << 20
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-rsrc-")
OBJECTS = {"corpus/v1/train.bin": os.urandom(2 * CHUNK + 77), "corpus/v1/val.bin": os.urandom(50_000),
           "corpus/v1/meta/vocab.txt": b"a b c\n", "corpus/v2/other.bin": b"not under the prefix"}
WEB_FILE = os.urandom(3 * CHUNK + 5)
OPERATOR_SECRET = "operator-secret-never-on-a-node"


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A deployed 3-node sim cluster over SSH, and a moto S3 server its nodes reach."""
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("fetch")
    toml = ssh_sim_toml(CLUSTER, NODES, OCTET)
    (folder / "fatpipe.toml").write_text(toml)
    write_node_python(folder, sys.executable)
    deployed = fatpipe(folder, "deploy", CLUSTER)
    assert deployed.returncode == 0, deployed.stdout
    s3_port = free_port()
    s3 = s3_server(HOST, s3_port, "fp-data", OBJECTS)
    try:
        yield folder, toml, s3_port
    finally:
        s3.stop()
        down = fatpipe(folder, "down", CLUSTER, timeout=300)
        assert down.returncode == 0, down.stdout


def declare(folder: Path, toml: str, data: str) -> None:
    (folder / "fatpipe.toml").write_text(toml + "\n[data]\n" + data)


def node_path(folder: Path, index: int, rel: str) -> Path:
    outputs = json.loads((folder / ".fatpipe" / CLUSTER / "outputs.json").read_text())
    return Path(outputs["nodes"][index]["remote_dir"]) / rel


def push(folder: Path, python: str) -> subprocess.CompletedProcess:
    return fatpipe(folder, "data", "push", CLUSTER, "--remote-python", python)


def test_every_node_fetches_an_s3_prefix_with_its_own_credentials(cluster, monkeypatch):
    folder, toml, port = cluster
    declare(folder, toml, f'source = "s3://fp-data/corpus/v1"\npath = "data/set"\nchunk_mib = 1\n'
                          f'endpoint_url = "http://{HOST}:{port}"\nregion = "us-east-1"\ninsecure_http = true\n')
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", OPERATOR_SECRET)  # this machine's: no node ever sees them
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", OPERATOR_SECRET)
    bare = push(folder, sys.executable)
    assert bare.returncode == 1 and "fetching the data failed: no AWS credentials on this node" in bare.stdout, \
        bare.stdout[-3000:]

    node_python = str(folder / "node-python")
    done = push(folder, node_python)
    total = sum(len(v) for k, v in OBJECTS.items() if k.startswith("corpus/v1/"))
    assert done.returncode == 0, done.stdout[-5000:]
    assert f"fetched data/set on {NODES} node(s) from s3://fp-data/corpus/v1: {total} bytes, {NODES * total} " \
           "fetched" in done.stdout, done.stdout[-3000:]
    for i in range(NODES):
        for key, data in OBJECTS.items():
            held = node_path(folder, i, "data/set/" + key.removeprefix("corpus/v1/"))
            assert held.read_bytes() == data if key.startswith("corpus/v1/") else not held.exists()
    leaked = subprocess.run(["grep", "-rl", OPERATOR_SECRET, str(node_path(folder, 0, "")), str(folder / ".fatpipe")],
                            capture_output=True, text=True)
    assert leaked.stdout == "", leaked.stdout  # no file here or on a node holds this machine's credentials

    verify = fatpipe(folder, "data", "verify", CLUSTER, "--remote-python", node_python)
    assert verify.returncode == 0 and verify.stdout.count("matches") == NODES, verify.stdout
    again = push(folder, node_python)
    assert again.returncode == 0 and f"{total} bytes, 0 fetched" in again.stdout, again.stdout[-3000:]

    with open(node_path(folder, 2, "data/set/train.bin"), "r+b") as f:
        f.seek(CHUNK + 3)
        f.write(b"\xff\x00")
    verify = fatpipe(folder, "data", "verify", CLUSTER, "--remote-python", node_python)
    assert verify.returncode == 1, verify.stdout
    assert f"{CLUSTER}-2: data/set/train.bin: chunk 1 differs from the manifest" in verify.stdout, verify.stdout
    launch = fatpipe(folder, "launch", CLUSTER, "--max-restarts", "0", "--remote-python", node_python,
                     "--", "-c", "print('started')")
    errors = [line for line in launch.stdout.splitlines() if line.startswith("Error:")]
    assert launch.returncode != 0 and len(errors) == 1, launch.stdout[-3000:]
    assert f"node {CLUSTER}-2: data/set/train.bin: chunk 1" in errors[0], errors

    fixed = push(folder, node_python)  # node 2 fetches that one file again; the others nothing
    size = len(OBJECTS["corpus/v1/train.bin"])
    assert fixed.returncode == 0 and f"{total} bytes, {size} fetched" in fixed.stdout, fixed.stdout[-3000:]
    assert node_path(folder, 2, "data/set/train.bin").read_bytes() == OBJECTS["corpus/v1/train.bin"]


def test_an_https_file_interrupted_half_way_resumes_on_every_node(cluster, tmp_path):
    folder, toml, _ = cluster
    web, ca = https_server(tmp_path, HOST, free_port(), {"/sets/train.bin": WEB_FILE}, cuts=1000)
    try:
        (folder / "certs").mkdir(exist_ok=True)
        (folder / "certs" / "ca.pem").write_bytes(ca.read_bytes())
        declare(folder, toml, f'source = "https://{HOST}:{web.server_address[1]}/sets/train.bin"\n'
                              'path = "data/train.bin"\nchunk_mib = 1\nca_bundle = "certs/ca.pem"\n')
        # The node's own python3 (no --remote-python): an https source needs the standard library only.
        cut = fatpipe(folder, "data", "push", CLUSTER)  # every reply stops half way: each node keeps what came
        assert cut.returncode == 1 and "run the push again: it resumes" in cut.stdout, cut.stdout[-3000:]
        for i in range(NODES):
            partial = node_path(folder, i, "data/train.bin.fatpipe-partial")
            assert CHUNK < partial.stat().st_size < len(WEB_FILE) and not node_path(folder, i, "data/train.bin").exists()
        held = [node_path(folder, i, "data/train.bin.fatpipe-partial").stat().st_size for i in range(NODES)]

        web.cuts, web.requests[:] = 0, []
        resumed = fatpipe(folder, "data", "push", CLUSTER)
        assert resumed.returncode == 0, resumed.stdout[-5000:]
        fetched = sum(len(WEB_FILE) - h for h in held)
        assert f"{len(WEB_FILE)} bytes, {fetched} fetched" in resumed.stdout, resumed.stdout[-3000:]
        ranges = sorted(r[2] for r in web.requests if r[0] == "GET")
        assert ranges == sorted(f"bytes={h}-" for h in held), ranges  # each node from where it stopped
        for i in range(NODES):
            assert node_path(folder, i, "data/train.bin").read_bytes() == WEB_FILE
            assert not node_path(folder, i, "data/train.bin.fatpipe-partial").exists()
        verify = fatpipe(folder, "data", "verify", CLUSTER)
        assert verify.returncode == 0 and verify.stdout.count("matches") == NODES, verify.stdout
    finally:
        web.stop()


def test_up_fetches_what_a_node_lacks_before_it_launches(cluster):
    folder, toml, port = cluster
    declare(folder, toml, f'source = "s3://fp-data/corpus/v1"\npath = "data/set"\nchunk_mib = 1\n'
                          f'endpoint_url = "http://{HOST}:{port}"\ninsecure_http = true\n')
    node_python = str(folder / "node-python")
    assert push(folder, node_python).returncode == 0
    node_path(folder, 1, "data/set/val.bin").unlink()
    (folder / "job.py").write_text("import os; print('job sees', os.environ['FATPIPE_DATA'], flush=True)\n")
    up = fatpipe(folder, "up", CLUSTER, "--netcheck", "off", "--max-restarts", "0", "--remote-python",
                 node_python, "--", "job.py", timeout=900)
    assert up.returncode == 0, up.stdout[-5000:]
    total = sum(len(v) for k, v in OBJECTS.items() if k.startswith("corpus/v1/"))
    assert f"{CLUSTER}-1: {total} of {total} bytes held, fetching at" in up.stdout, up.stdout[-5000:]
    report = json.loads(sorted((folder / ".fatpipe" / CLUSTER / "runs").glob("*/up.json"))[-1].read_text())
    phases = {p["name"]: p for p in report["phases"]}
    assert phases["data"]["state"] == "done", phases
    assert phases["data"]["note"] == f"{total} bytes; {len(OBJECTS['corpus/v1/val.bin'])} fetched", phases
    assert node_path(folder, 1, "data/set/val.bin").read_bytes() == OBJECTS["corpus/v1/val.bin"]
    assert f"job sees {node_path(folder, 1, 'data/set')}" in up.stdout, up.stdout[-3000:]
