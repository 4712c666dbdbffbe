"""A dataset folder holds its manifest and nothing else, and nothing changes under a live run.

Two sim nodes reached over SSH (network namespaces on a bridge) and a moto S3 server on this
machine's address on the bridge. A hostile bucket (keys that climb out, absolute ones, empty
segments, control characters, fatpipe's own names, names too long, a file that is also a folder)
writes nothing anywhere: one line naming the key and the source, exit non-zero. Names that only
look odd (fullwidth dots, a division slash) land inside the folder. A link planted in a node's
folder never leads a write out, and a link in a local source is refused before anything moves.
A push makes each node's folder equal to the manifest and names what it removed; `verify` and
`launch` name a file planted beside the data. `data push`, `deploy` and `netcheck --run-dir`
refuse while a run is live, naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from dataservers import s3_server, write_node_python

from .conftest import fatpipe_cli, free_port, require_ssh_sim, ssh_sim_toml

pytestmark = pytest.mark.slow

CLUSTER, OCTET, NODES = "dzb", 206, 2
HOST = f"10.{OCTET}.0.1"  # this machine on the cluster's bridge
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-dzb-")
ESCAPE = f"dz-escape-{uuid.uuid4().hex[:8]}"  # any file or folder of this name outside is a failure
CLIMB = "../" * 24  # from any node folder up to /
HOSTILE = {  # prefix -> the one hostile key beside a harmless good.bin (tests/unit/test_data_names.py: the rest)
    "climb": f"climb/{CLIMB}tmp/{ESCAPE}-1",
    "slash": f"slash//tmp/{ESCAPE}-2",
    "sub": f"sub/a/{CLIMB}tmp/{ESCAPE}-3",
    "control": f"control/a\x1bb-{ESCAPE}",
    "own": "own/.fatpipe-manifest.json",
    "clash": "clash/good.bin/inner",
}
FINE = {"fine/\uff0e\uff0e/wide-dots.bin": b"fullwidth dots are a name, not a parent",
        "fine/a\u2215b.bin": b"a division slash is no separator", "fine/..x.bin": b"dots inside a name",
        "fine/\u00fcn\u00efcode.bin": b"accents", "fine/sub/deep.bin": b"a sub folder"}
OBJECTS = {**{f"{p}/good.bin": b"harmless" for p in HOSTILE}, **{k: b"hostile" for k in HOSTILE.values()},
           **FINE, "planted/sub/x.bin": b"real data", "planted/f.bin": b"real file"}
JOB = """\
import os, pathlib, sys, time
pathlib.Path("alive-" + os.environ.get("FATPIPE_NODE_NAME", "x")).write_text("yes")
time.sleep(float(sys.argv[1]))
"""


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("Error:")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A deployed 2-node sim cluster over SSH, a moto S3 server its nodes reach, a folder outside."""
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("bounds")
    toml = ssh_sim_toml(CLUSTER, NODES, OCTET)
    (folder / "fatpipe.toml").write_text(toml)
    (folder / ".gitignore").write_text("data/\nsrc/\n")
    (folder / "job.py").write_text(JOB)
    write_node_python(folder, sys.executable)
    deployed = fatpipe(folder, "deploy", CLUSTER)
    assert deployed.returncode == 0, deployed.stdout
    port = free_port()
    s3 = s3_server(HOST, port, "fp-hostile", OBJECTS)
    try:
        yield folder, toml, port, tmp_path_factory.mktemp("outside")
    finally:
        s3.stop()
        fatpipe(folder, "stop", CLUSTER, timeout=300)
        down = fatpipe(folder, "down", CLUSTER, timeout=300)
        assert down.returncode == 0, down.stdout


def node_path(folder: Path, index: int, rel: str) -> Path:
    outputs = json.loads((folder / ".fatpipe" / CLUSTER / "outputs.json").read_text())
    return Path(outputs["nodes"][index]["remote_dir"]) / rel


def declare(folder: Path, toml: str, data: str) -> None:
    (folder / "fatpipe.toml").write_text(toml + "\n[data]\n" + data)


def declare_s3(folder: Path, toml: str, port: int, prefix: str, path: str) -> None:
    declare(folder, toml, f'source = "s3://fp-hostile/{prefix}"\npath = "{path}"\nchunk_mib = 1\n'
                          f'endpoint_url = "http://{HOST}:{port}"\nregion = "us-east-1"\ninsecure_http = true\n')


def push(folder: Path, python: str = sys.executable) -> subprocess.CompletedProcess:
    return fatpipe(folder, "data", "push", CLUSTER, "--remote-python", python)


def escaped(folder: Path) -> list[str]:
    """Every path named like an escape, in /tmp, around the nodes' folders and in the project."""
    roots = {Path("/tmp"), node_path(folder, 0, "").parent.parent, folder}
    found = subprocess.run(["find", *map(str, roots), "-name", f"*{ESCAPE}*"], capture_output=True, text=True)
    return found.stdout.split()


def test_a_hostile_bucket_writes_nothing_anywhere(cluster):
    folder, toml, port, _ = cluster
    node_python = str(folder / "node-python")
    for prefix, key in HOSTILE.items():
        declare_s3(folder, toml, port, prefix, f"data/{prefix}")
        refused = push(folder, node_python)
        assert refused.returncode != 0 and len(errors(refused)) == 1, (prefix, refused.stdout[-3000:])
        line = errors(refused)[0]
        assert f"s3://fp-hostile/{prefix}" in line and "Traceback" not in refused.stdout, (prefix, line)
        if prefix != "clash":  # the key itself is named (the clash names both of its names)
            assert repr(key) in line, (prefix, line)
        for i in range(NODES):  # nothing written: not even the harmless file beside it
            assert not node_path(folder, i, f"data/{prefix}").exists(), (prefix, i)
    assert escaped(folder) == []


def test_names_that_only_look_odd_land_inside_and_planted_links_lead_nowhere(cluster):
    folder, toml, port, outside = cluster
    node_python = str(folder / "node-python")
    declare_s3(folder, toml, port, "fine", "data/fine")
    done = push(folder, node_python)
    assert done.returncode == 0, done.stdout[-3000:]
    for i in range(NODES):
        for key, data in FINE.items():
            assert node_path(folder, i, "data/fine/" + key.removeprefix("fine/")).read_bytes() == data

    # A link planted in node 1's folder, to a folder and to a file outside it: the push writes the
    # real data in their place and never touches what they point to.
    (outside / "victim").write_bytes(b"outside, untouched")
    planted = node_path(folder, 1, "data/planted")
    planted.mkdir(parents=True)
    (planted / "sub").symlink_to(outside)
    (planted / "f.bin").symlink_to(outside / "victim")
    declare_s3(folder, toml, port, "planted", "data/planted")
    done = push(folder, node_python)
    assert done.returncode == 0, done.stdout[-3000:]
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"outside, untouched"
    for i in range(NODES):
        assert node_path(folder, i, "data/planted/sub/x.bin").read_bytes() == b"real data"
        assert not node_path(folder, i, "data/planted/sub").is_symlink()
        assert node_path(folder, i, "data/planted/f.bin").read_bytes() == b"real file"
    verify = fatpipe(folder, "data", "verify", CLUSTER, "--remote-python", node_python)
    assert verify.returncode == 0 and verify.stdout.count("matches") == NODES, verify.stdout


def test_a_link_in_a_local_source_is_refused_before_anything_moves(cluster):
    folder, toml, _, outside = cluster
    (outside / "secret").write_text("never leaves this machine")
    for name, target in (("to-file", outside / "secret"), ("to-folder", outside), ("dangling", outside / "no")):
        source = folder / "src" / name
        source.mkdir(parents=True)
        (source / "good.bin").write_bytes(b"fine")
        (source / "link").symlink_to(target)
        declare(folder, toml, f'source = "src/{name}"\npath = "data/{name}"\nchunk_mib = 1\n')
        refused = push(folder)
        assert refused.returncode == 2 and len(errors(refused)) == 1, refused.stdout[-3000:]
        assert "link is a symbolic link" in errors(refused)[0] and "copies no links" in errors(refused)[0]
        for i in range(NODES):
            assert not node_path(folder, i, f"data/{name}").exists()


def test_a_push_makes_each_folder_its_manifest_and_verify_and_launch_name_extras(cluster):
    folder, toml, _, _ = cluster
    source = folder / "data" / "tok"
    source.mkdir(parents=True)
    shards = {f"train_{i:03d}.bin": os.urandom(300_000 + i) for i in range(3)}
    for name, data in shards.items():
        (source / name).write_bytes(data)
    declare(folder, toml, 'source = "data/tok"\nchunk_mib = 1\n')
    first = push(folder)
    assert first.returncode == 0, first.stdout[-3000:]

    # Re-tokenised into fewer shards, the two left unchanged: nothing moves, the third goes.
    (source / "train_002.bin").unlink()
    second = push(folder)
    assert second.returncode == 0, second.stdout[-3000:]
    for i in range(NODES):
        assert f"{CLUSTER}-{i}: removed 1 file(s) the manifest does not list from data/tok: train_002.bin" \
            in second.stdout, second.stdout[-3000:]
        held = node_path(folder, i, "data/tok")
        assert sorted(p.name for p in held.iterdir() if not p.name.startswith(".")) == ["train_000.bin", "train_001.bin"]
        listed = json.loads((held / ".fatpipe-manifest.json").read_text())["files"]  # what the trainer reads
        assert [f["name"] for f in listed] == ["train_000.bin", "train_001.bin"]

    node_path(folder, 1, "data/tok/stale.bin").write_bytes(b"put there by hand")
    node_path(folder, 1, "data/tok/old").mkdir()
    node_path(folder, 1, "data/tok/old/train_009.bin").write_bytes(b"from some other run")
    verify = fatpipe(folder, "data", "verify", CLUSTER, "--remote-python", sys.executable)
    assert verify.returncode == 1, verify.stdout
    assert f"{CLUSTER}-1: data/tok holds 2 file(s) the manifest does not list: old/train_009.bin, stale.bin" in verify.stdout
    launch = fatpipe(folder, "launch", CLUSTER, "--max-restarts", "0", "--remote-python", sys.executable,
                     "--", "job.py", "0")
    assert launch.returncode != 0 and len(errors(launch)) == 1, launch.stdout[-3000:]
    assert f"node {CLUSTER}-1: data/tok holds 2 file(s) the manifest does not list: old/train_009.bin, stale.bin" in errors(launch)[0]
    fixed = push(folder)
    assert fixed.returncode == 0 and f"{CLUSTER}-1: removed 2 file(s)" in fixed.stdout, fixed.stdout[-3000:]
    assert not node_path(folder, 1, "data/tok/stale.bin").exists() and not node_path(folder, 1, "data/tok/old").exists()


def test_push_deploy_and_netcheck_refuse_while_a_run_is_live(cluster):
    folder, toml, _, _ = cluster
    source = folder / "data" / "live"
    source.mkdir(parents=True, exist_ok=True)
    (source / "train.bin").write_bytes(os.urandom(200_000))
    declare(folder, toml, 'source = "data/live"\nchunk_mib = 1\n')
    assert push(folder).returncode == 0
    started = fatpipe(folder, "launch", CLUSTER, "--max-restarts", "0", "--remote-python", sys.executable,
                      "--detach", "--", "job.py", "600")
    assert started.returncode == 0, started.stdout[-3000:]
    alive = [node_path(folder, i, f"alive-{CLUSTER}-{i}") for i in range(NODES)]
    deadline = time.monotonic() + 300
    while not all(p.exists() for p in alive) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(p.exists() for p in alive), fatpipe(folder, "logs", CLUSTER).stdout[-3000:]
    run_id = (folder / ".fatpipe" / CLUSTER / "runs" / "latest").read_text().strip()
    assert run_id
    try:
        (source / "train.bin").write_bytes(os.urandom(200_000))  # what a push would send, were it allowed
        for args in (("data", "push", CLUSTER), ("deploy", CLUSTER),
                     ("netcheck", CLUSTER, "--run-dir", str(folder / "elsewhere"))):
            refused = fatpipe(folder, *args)
            assert refused.returncode != 0 and len(errors(refused)) == 1, (args, refused.stdout[-3000:])
            assert f"run {run_id}" in errors(refused)[0] and "is still running" in errors(refused)[0], \
                (args, errors(refused))
        assert node_path(folder, 1, "data/live/train.bin").read_bytes() != (source / "train.bin").read_bytes()
    finally:
        stopped = fatpipe(folder, "stop", CLUSTER)
        assert stopped.returncode == 0, stopped.stdout[-3000:]
