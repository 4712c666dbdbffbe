"""netbench and the p2p tool as real processes on 127.0.0.1: no root, a few seconds each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from fatpipe.trainer.net import bench as nb
from fatpipe.trainer.net import p2p

JOIN_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_socket_tool_measures_on_the_receiving_side():
    port = free_port()
    ready = threading.Event()
    server = threading.Thread(target=p2p.serve, args=("127.0.0.1", port),
                              kwargs={"sessions": 2, "idle_timeout": 30, "ready": ready.set}, daemon=True)
    server.start()
    assert ready.wait(10)
    asked_s = 0.5
    for streams in (1, 3):
        started = time.monotonic()
        r = p2p.socket_client("127.0.0.1", port, streams=streams, seconds=asked_s, bind="127.0.0.1")
        session_s = time.monotonic() - started
        assert r["tool"] == "socket" and r["streams"] == streams
        # The receiver's window spans the time asked and lies inside the client's session.
        assert r["bytes"] > 0 and 0.6 * asked_s < r["seconds"] <= session_s, (r, session_s)
        assert r["gbps"] == pytest.approx(r["bytes"] * 8 / r["seconds"] / 1e9)
    server.join(10)
    assert not server.is_alive()  # it ends after the sessions it was asked for


def test_p2p_cli_client_against_cli_server():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "fatpipe.trainer.net.p2p", "server", "--bind", "127.0.0.1",
                               "--port", str(port), "--sessions", "1", "--idle-timeout", "30"])
    try:
        out = subprocess.run([sys.executable, "-m", "fatpipe.trainer.net.p2p", "client", "--connect", "127.0.0.1",
                              "--port", str(port), "--tool", "socket", "--streams", "2", "--seconds", "0.5"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        result = json.loads(out)
        assert result["streams"] == 2 and result["gbps"] > 0
        assert server.wait(timeout=15) == 0
    finally:
        if server.poll() is None:
            server.kill()


def test_server_start_is_confirmed_or_explained():
    port = free_port()
    proc = p2p.start_server("socket", "127.0.0.1", port, idle_timeout=30)
    try:
        assert p2p.wait_listening(proc, "127.0.0.1", port) is None
        assert p2p.is_listening("127.0.0.1", port)
    finally:
        p2p.stop_server(proc)
    assert not p2p.is_listening("127.0.0.1", port)


def test_server_that_cannot_bind_says_why():
    """A port already in use: the reason comes back instead of clients retrying into a void."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = p2p.start_server("socket", "127.0.0.1", port, idle_timeout=30)
        # Poll for the exit rather than the port, which `taken` holds.
        proc.wait(timeout=30)
        why = p2p.wait_listening(proc, "127.0.0.1", port, timeout=1)
    assert why is not None and why.startswith("the server exited") and "in use" in why


@pytest.mark.slow
def test_netbench_under_torchrun_on_two_local_nodes(tmp_path):
    """Two torchrun agents (two "nodes" of one process each) on 127.0.0.1: the sweep, the
    latency and the p2p step all run, and rank 0 writes a consistent result."""
    out = tmp_path / "netbench.json"
    master, p2p_port = free_port(), free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(master),
               "-m", "fatpipe.trainer.net.bench", "--out", str(out), "--min-size", "64K", "--max-size", "1M",
               "--quick", "--timeout-s", "60", "--p2p-tool", "socket", "--p2p-seconds", "0.5",
               "--p2p-port", str(p2p_port), "--streams", "2"]
        procs.append(subprocess.Popen(cmd, env={**env, "FATPIPE_NODE_NAME": f"local-{node}"},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=JOIN_TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    doc = json.loads(out.read_text())
    printed = [line for line in logs[0].splitlines() if line.startswith(nb.RESULT_PREFIX)]
    assert json.loads(printed[0][len(nb.RESULT_PREFIX):]) == doc

    assert doc["backend"] == "gloo" and doc["world_size"] == 2 and doc["nnodes"] == 2
    assert [r["size"] for r in doc["allreduce"]] == [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]
    for row in doc["allreduce"]:
        assert (row["warmup"], row["iters"]) == nb.iterations(row["size"], quick=True)
        assert row["time_s"] > 0
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"])  # 2 ranks: factor 1
        assert row["algbw_gbs"] == pytest.approx(row["size"] / row["time_s"] / 1e9)
    assert doc["busbw_gbps"] == doc["allreduce"][-1]["busbw_gbps"]
    # One small all-reduce's mean time, not the loop's total: less than one all-reduce of each of
    # the sweep's sizes together.
    assert 0 < doc["latency_s"] < sum(row["time_s"] for row in doc["allreduce"]), doc

    p2p_doc = doc["p2p"]
    assert p2p_doc["tool"] == "socket" and p2p_doc["streams"] == [1, 2]
    assert [(r["client"], r["server"], r["streams"]) for r in p2p_doc["results"]] == [
        ("local-1", "local-0", 1), ("local-1", "local-0", 2)]
    assert all(r["gbps"] > 0 and "error" not in r for r in p2p_doc["results"])
