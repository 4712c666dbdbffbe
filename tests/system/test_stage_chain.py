"""The staging chain on its own: this machine as its head and four node programs started as a push
starts them (through each node's transport), talking over loopback sockets, each in a project folder
of its own, holding different parts of the data; only what each lacks travels.
And nodes that share this machine's files: one local copy, checked before a launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.ops.data.chain import fan_out_chain
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.trainer.staging.manifest import PARTIAL_SUFFIX, build_manifest, first_difference

from .conftest import free_port

CHUNK = 1 << 20
WORLD = 4


def chain_cluster(tmp_path: Path, world: int = WORLD) -> Cluster:
    """`world` nodes on this machine's loopback (127.42.0.10 + i), each in a project folder of its
    own (node<i>), as the chain sees them: its program started through the node's transport."""
    (tmp_path / "fatpipe.toml").write_text(f'[clusters.demo]\nprovider = "sim"\nnodes = {world}\n')
    outputs = parse_outputs({
        "name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24", "rdzv_port": free_port(),
        "nodes": [{"name": f"n{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local",
                   "remote_dir": str(tmp_path / f"node{i}")} for i in range(world)]})
    for i in range(world):
        (tmp_path / f"node{i}").mkdir(exist_ok=True)
    return Cluster.resolve(load_project(tmp_path / "fatpipe.toml"), "demo").deployed(outputs)


def test_the_chain_fills_each_node_with_only_what_it_lacks(tmp_path):
    """Headed by this machine: what node 0 lacks comes over its program's input and goes on as it
    lands; a chunk node 0 holds travels from node 0, not from this machine."""
    source = tmp_path / "src" / "set"
    source.mkdir(parents=True)
    (source / "big.bin").write_bytes(os.urandom(6 * CHUNK + 999))
    (source / "small.txt").write_bytes(os.urandom(50))
    (source / "empty").write_bytes(b"")
    manifest = build_manifest(source, CHUNK, "data/set")
    big = (source / "big.bin").read_bytes()
    for rank in range(WORLD):
        (tmp_path / f"node{rank}" / "data" / "set").mkdir(parents=True)
    node0 = tmp_path / "node0" / "data" / "set"
    (node0 / ("big.bin" + PARTIAL_SUFFIX)).write_bytes(big[:4 * CHUNK])  # an interrupted push: chunks 0-3
    node1 = tmp_path / "node1" / "data" / "set"
    (node1 / ("big.bin" + PARTIAL_SUFFIX)).write_bytes(big[:2 * CHUNK + 5])  # chunks 0-1
    (node1 / "small.txt").write_bytes((source / "small.txt").read_bytes())
    node2 = tmp_path / "node2" / "data" / "set"
    corrupt = bytearray(big)
    corrupt[4 * CHUNK + 1] ^= 0xFF
    (node2 / "big.bin").write_bytes(bytes(corrupt))  # one bad chunk, else complete
    (node2 / "small.txt").write_bytes((source / "small.txt").read_bytes())
    (node2 / "empty").write_bytes(b"")

    report = fan_out_chain(chain_cluster(tmp_path), manifest, source, sys.executable, None, uplink=True)
    received = {n["node"]: n["received"] for n in report["nodes"]}
    # Over the uplink: node 0's chunks 4-6 and small.txt; n1 its chunks 2-6 (2-3 from node 0) and
    # small.txt on its way to n3; n2 relays those and takes its bad chunk 4; n3 gets everything.
    relayed = len(big) - 2 * CHUNK + 50
    assert received == {"n0": len(big) - 4 * CHUNK + 50, "n1": relayed, "n2": relayed, "n3": len(big) + 50}
    assert report["uplink_s"] is not None
    for rank in range(WORLD):
        assert first_difference(manifest, tmp_path / f"node{rank}") is None, rank
        assert (tmp_path / f"node{rank}" / "data" / "set" / ".fatpipe-manifest.json").is_file()
        assert not list((tmp_path / f"node{rank}").rglob(f"*{PARTIAL_SUFFIX}"))


def test_a_chain_whose_source_fails_ends_on_every_node_and_says_why(tmp_path):
    """This machine's failure (the source gone since it was hashed) ends node 0's input, so every
    node's program; the error names this machine; what came stays partial for the next push."""
    data = os.urandom(3 * CHUNK + 5)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "c.bin").write_bytes(data)
    manifest = build_manifest(tmp_path / "src" / "c.bin", CHUNK, "data/c.bin")
    cluster = chain_cluster(tmp_path, 3)
    (tmp_path / "src" / "c.bin").unlink()
    with pytest.raises(FatpipeError, match=r"data fan-out failed: this machine: .*No such file.*c\.bin"):
        fan_out_chain(cluster, manifest, tmp_path / "src" / "c.bin", sys.executable, None, uplink=True)
    assert not any((tmp_path / f"node{i}" / "data" / "c.bin").exists() for i in range(3))
    assert not subprocess.run(["pgrep", "-f", str(tmp_path / "node")], capture_output=True).stdout


def local_outputs(port: int) -> dict:
    return {"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24", "rdzv_port": port,
            "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local"}
                      for i in range(2)]}


def test_nodes_sharing_this_machine_get_one_copy_and_launch_refuses_a_difference(run_cli, project_dir, tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.bin"  # outside the project: an absolute source
    corpus.write_bytes(os.urandom(CHUNK + 10))
    (project_dir / "fatpipe.toml").write_text('[clusters.demo]\nprovider = "sim"\nnodes = 2\n'
                                              f'[data]\nsource = "{corpus}"\npath = "data/corpus.bin"\nchunk_mib = 1\n')
    (project_dir / "outputs.json").write_text(json.dumps(local_outputs(free_port())))
    (project_dir / "job.py").write_text("import os; print('data at', os.environ['FATPIPE_DATA'])\n")
    common = ["--outputs", "outputs.json"]

    refused = run_cli("launch", "demo", *common, "--max-restarts", "0", "--", "job.py")
    assert refused.exit_code == 1 and "none was staged: run `fatpipe data push demo`" in refused.output

    pushed = run_cli("data", "push", "demo", *common)
    assert pushed.exit_code == 0, pushed.output
    assert (project_dir / "data" / "corpus.bin").read_bytes() == corpus.read_bytes()
    assert (project_dir / "data" / "corpus.bin.fatpipe-manifest.json").is_file()
    assert run_cli("data", "verify", "demo", *common).output.count("matches") == 2

    (project_dir / "data" / "corpus.bin").write_bytes(corpus.read_bytes()[:-1])
    verify = run_cli("data", "verify", "demo", *common)
    assert verify.exit_code == 1 and f"demo-1: data/corpus.bin: {CHUNK + 9} bytes, the manifest says" in verify.output
    refused = run_cli("launch", "demo", *common, "--max-restarts", "0", "--", "job.py")
    assert refused.exit_code == 1 and "node demo-0: data/corpus.bin:" in refused.output
    assert "data at" not in refused.output

    assert run_cli("data", "push", "demo", *common).exit_code == 0
    launched = run_cli("launch", "demo", *common, "--max-restarts", "0", "--timeout", "150", "--", "job.py")
    assert launched.exit_code == 0 and f"data at {project_dir}/data/corpus.bin" in launched.output, launched.output


def isolated_python(folder: Path) -> str:
    """A Python with no site-packages (-I -S), as a node's python3: neither torch nor an installed
    fatpipe can be imported there, so the chain runs only on what a push sends."""
    wrapper = folder / "python-isolated"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_the_chain_needs_no_torch_and_holds_a_few_pieces_whatever_the_chunk(tmp_path):
    """Three nodes, 48 MiB in 16 MiB chunks: each node's program stays far below the data's size."""
    hidden = subprocess.run([sys.executable, "-I", "-S", "-c", "import torch"], capture_output=True, text=True)
    assert hidden.returncode != 0
    chunk, world = 16 << 20, 3
    (tmp_path / "src").mkdir()
    data = os.urandom(3 * chunk)
    (tmp_path / "src" / "big.bin").write_bytes(data)
    manifest = build_manifest(tmp_path / "src" / "big.bin", chunk, "data/big.bin")
    result = fan_out_chain(chain_cluster(tmp_path, world), manifest, tmp_path / "src" / "big.bin",
                           isolated_python(tmp_path), None, uplink=True)
    for rank in range(world):
        assert (tmp_path / f"node{rank}" / "data" / "big.bin").read_bytes() == data
    peaks = [n["peak_rss"] for n in result["nodes"]]  # each process's own (VmHWM), not its parent's
    assert all(0 < peak < 64 << 20 for peak in peaks), [f"{peak / 2**20:.0f} MiB" for peak in peaks]
