"""trainer.staging.stage's chain on its own: four real processes over loopback sockets, each in a
project folder of its own, holding different parts of the data; only what each lacks travels.
And nodes that share this machine's files: one local copy, checked before a launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fatpipe.trainer.staging.chainlink import TOKEN_ENV
from fatpipe.trainer.staging.manifest import PARTIAL_SUFFIX, build_manifest, first_difference

from .conftest import free_port

CHUNK = 1 << 20
WORLD = 4


def chain_args(rank: int, world: int, ports: list[int]) -> list[str]:
    """Place `rank` of a chain on loopback: where it listens and where the next one does."""
    return ["--place", str(rank), "--nodes", str(world),
            *(["--listen", f"127.0.0.1:{ports[rank]}"] if rank > 0 else []),
            *(["--next", f"127.0.0.1:{ports[rank + 1]}"] if rank + 1 < world else [])]


def start_ranks(tmp_path: Path, manifest_file: Path, port: int, world: int = WORLD,
                extra: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    procs, ports = [], [port, *(free_port() for _ in range(world - 1))]
    for rank in range(world):
        env = {**os.environ, TOKEN_ENV: "t0ken", "FATPIPE_NODE_NAME": f"n{rank}"}
        procs.append(subprocess.Popen([sys.executable, "-m", "fatpipe.trainer.staging.stage", "--manifest",
                                       str(manifest_file), "--timeout-s", "120", *chain_args(rank, world, ports),
                                       *extra], cwd=tmp_path / f"node{rank}",
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def test_the_chain_fills_each_node_with_only_what_it_lacks(tmp_path):
    source = tmp_path / "node0" / "data" / "set"
    source.mkdir(parents=True)
    (source / "big.bin").write_bytes(os.urandom(6 * CHUNK + 999))
    (source / "small.txt").write_bytes(os.urandom(50))
    (source / "empty").write_bytes(b"")
    manifest = build_manifest(source, CHUNK, "data/set")
    big = (source / "big.bin").read_bytes()
    for rank in range(1, WORLD):
        (tmp_path / f"node{rank}" / "data" / "set").mkdir(parents=True)
    node1 = tmp_path / "node1" / "data" / "set"
    (node1 / ("big.bin" + PARTIAL_SUFFIX)).write_bytes(big[:2 * CHUNK + 5])  # an interrupted copy
    (node1 / "small.txt").write_bytes((source / "small.txt").read_bytes())
    node2 = tmp_path / "node2" / "data" / "set"
    corrupt = bytearray(big)
    corrupt[4 * CHUNK + 1] ^= 0xFF
    (node2 / "big.bin").write_bytes(bytes(corrupt))  # one bad chunk, else complete
    (node2 / "small.txt").write_bytes((source / "small.txt").read_bytes())
    (node2 / "empty").write_bytes(b"")
    manifest_file = tmp_path / "manifest.json"
    manifest_file.write_text(json.dumps(manifest))

    procs = start_ranks(tmp_path, manifest_file, free_port())
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, "\n".join(outs)
    result = json.loads(next(line for line in outs[0].splitlines() if line.startswith("STAGE_JSON "))[11:])
    received = {n["node"]: n["received"] for n in result["nodes"]}
    # n1 lacks big.bin's chunks 2..6; n2 relays those and receives its bad chunk 4; n3 gets everything.
    assert received == {"n0": 0, "n1": len(big) - 2 * CHUNK, "n2": len(big) - 2 * CHUNK,
                        "n3": len(big) + 50}
    for rank in range(WORLD):
        assert first_difference(manifest, tmp_path / f"node{rank}") is None, rank
        assert (tmp_path / f"node{rank}" / "data" / "set" / ".fatpipe-manifest.json").is_file()
        assert not list((tmp_path / f"node{rank}").rglob(f"*{PARTIAL_SUFFIX}"))
    assert any(line.startswith("STAGE_PROGRESS 3 ") for line in outs[3].splitlines())


def test_rank_0_waits_for_the_uplink_copy_then_chains_it_or_stops_with_its_error(tmp_path):
    """The chain starts while node 0's copy is still arriving: rank 0 waits for the copy's word."""
    data = os.urandom(3 * CHUNK + 5)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "c.bin").write_bytes(data)
    manifest_file = tmp_path / "manifest.json"
    manifest_file.write_text(json.dumps(build_manifest(tmp_path / "src" / "c.bin", CHUNK, "data/c.bin")))
    ready = ".fatpipe/data/source-ready-t1"
    for rank in range(2):
        (tmp_path / f"node{rank}" / ".fatpipe" / "data").mkdir(parents=True)
    procs = start_ranks(tmp_path, manifest_file, free_port(), world=2, extra=("--source-ready", ready, "--wait-s", "240"))
    time.sleep(3)  # the ranks are up and waiting; node 0's copy lands, then its word
    assert all(p.poll() is None for p in procs)
    (tmp_path / "node0" / "data").mkdir()
    (tmp_path / "node0" / "data" / "c.bin").write_bytes(data)
    (tmp_path / "node0" / ready).write_text("ok\n")
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    assert (tmp_path / "node1" / "data" / "c.bin").read_bytes() == data

    (tmp_path / "node1" / "data" / "c.bin").unlink()
    (tmp_path / "node0" / ".fatpipe" / "data" / "source-ready-t2").write_text("failed: rsync: connection reset\n")
    procs = start_ranks(tmp_path, manifest_file, free_port(), world=2,
                        extra=("--source-ready", ".fatpipe/data/source-ready-t2", "--wait-s", "240"))
    rank0 = procs[0].communicate(timeout=300)[0]
    for p in procs[1:]:
        p.kill()
        p.communicate()
    assert procs[0].returncode != 0 and "fatpipe: the copy to node 0 failed: rsync: connection reset" in rank0


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


def run_as_sent(cwd: Path, argv: list[str], token: str) -> subprocess.Popen:
    """The chain's program as `fatpipe data push` sends it to a node, under a Python with no
    site-packages (-I -S): neither torch nor an installed fatpipe can be imported there."""
    from fatpipe.ops.data.nodeprogram import BOOT, program_line

    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", BOOT.read_text()], cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.stdin.write(program_line("fatpipe.trainer.staging.stage", argv, env={TOKEN_ENV: token}, watch=True))
    proc.stdin.flush()
    return proc


def test_the_chain_needs_no_torch_and_holds_a_few_pieces_whatever_the_chunk(tmp_path):
    """Three nodes, 48 MiB in 16 MiB chunks: each node's program stays far below the data's size."""
    hidden = subprocess.run([sys.executable, "-I", "-S", "-c", "import torch"], capture_output=True, text=True)
    assert hidden.returncode != 0
    chunk, world = 16 << 20, 3
    (tmp_path / "node0" / "data").mkdir(parents=True)
    data = os.urandom(3 * chunk)
    (tmp_path / "node0" / "data" / "big.bin").write_bytes(data)
    manifest_file = tmp_path / "manifest.json"
    manifest_file.write_text(json.dumps(build_manifest(tmp_path / "node0" / "data" / "big.bin", chunk, "data/big.bin")))
    ports = [free_port() for _ in range(world)]
    procs = []
    for rank in range(world):
        (tmp_path / f"node{rank}").mkdir(exist_ok=True)
        argv = ["--manifest", str(manifest_file), "--timeout-s", "120", *chain_args(rank, world, ports)]
        procs.append(run_as_sent(tmp_path / f"node{rank}", argv, "t0ken"))
    outs = []
    for p in procs:
        outs.append(p.stdout.read())
        p.stdin.close()
        p.wait(timeout=120)
    assert [p.returncode for p in procs] == [0] * world, "\n".join(outs)
    for rank in range(1, world):
        assert (tmp_path / f"node{rank}" / "data" / "big.bin").read_bytes() == data
    result = json.loads(next(line for line in outs[0].splitlines() if line.startswith("STAGE_JSON "))[11:])
    peaks = [n["peak_rss"] for n in result["nodes"]]  # each process's own (VmHWM), not its parent's
    assert all(0 < peak < 64 << 20 for peak in peaks), [f"{peak / 2**20:.0f} MiB" for peak in peaks]
