"""The quick link check without torch: the ring all-reduce over plain sockets is an all-reduce (every
node ends with the XOR of all, at every node count and in part-pieces), and the program runs on a
node's system Python from what the command sends, names the node that cannot join, and leaves
nothing running."""

from __future__ import annotations

import random
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.ops.net.options import NetcheckOptions
from fatpipe.ops.net.quick import ring_port, run_quick
from fatpipe.ops.reach.transport import LocalTransport
from fatpipe.trainer.net.p2p import is_listening
from fatpipe.trainer.net.ring import PIECE, Ring, RingBroke, xor


def free_base(count: int, host: str = "127.0.0.1") -> int:
    """A base port whose ring ports (base + 3i + 2, i < count) are free now: below the kernel's
    ephemeral range, so no other test's outgoing connection takes one meanwhile."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(100):
        base = random.randrange(20000, 28000)
        try:
            for i in range(count):
                with socket.socket(family) as probe:
                    probe.bind((host, base + 3 * i + 2))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports")


def rings(nodes: int, token: str = "t", host: str = "127.0.0.1") -> list[Ring]:
    base = free_base(nodes, host)
    ends = [(host, base + 3 * i + 2) for i in range(nodes)]
    made: list[Ring | None] = [None] * nodes

    def make(i: int) -> None:
        made[i] = Ring(ends[i], ends[(i + 1) % nodes], token, 20)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(made), "the ring did not form"
    return made


def every_node(ring_list: list[Ring], work) -> list:
    out: list = [None] * len(ring_list)

    def run(i: int) -> None:
        out[i] = work(i, ring_list[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ring_list))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.mark.parametrize(("nodes", "host"), [(2, "127.0.0.1"), (3, "127.0.0.1"), (5, "127.0.0.1"), (3, "::1")])
def test_the_ring_all_reduce_leaves_the_xor_of_every_node_on_every_node(nodes, host):
    members = rings(nodes, host=host)
    size = nodes * (PIECE + 777)  # a whole piece and a part-piece per chunk
    data = [random.Random(i).randbytes(size) for i in range(nodes)]
    expected = data[0]
    for other in data[1:]:
        expected = xor(expected, other)
    try:
        bufs = every_node(members, lambda i, r: (b := bytearray(data[i]), r.allreduce(b, i, nodes, reduce=True))[0])
        assert all(bytes(b) == expected for b in bufs)
        # Moved without arithmetic, every node ends with one node's bytes in each chunk: the same everywhere.
        moved = every_node(members, lambda i, r: (b := bytearray(data[i]), r.allreduce(b, i, nodes, reduce=False))[0])
        assert all(b == moved[0] for b in moved)
        everyone = every_node(members, lambda i, r: r.circulate(i, {"node": i}))
        assert everyone == [[{"node": i} for i in range(nodes)]] * nodes
    finally:
        for r in members:
            r.close()


def test_a_connection_without_the_token_is_not_taken_for_a_neighbour():
    base = free_base(2)
    ends = [("127.0.0.1", base + 2), ("127.0.0.1", base + 5)]
    made = {}
    first = threading.Thread(target=lambda: made.setdefault(0, Ring(ends[0], ends[1], "secret", 20)))
    first.start()
    time.sleep(0.3)
    with socket.create_connection(ends[0]) as stranger:  # says something else, is dropped
        stranger.sendall(b"\x00\x00\x00\x05wrong")
        made[1] = Ring(ends[1], ends[0], "secret", 20)
        first.join(30)
        assert stranger.recv(1) == b""
    try:
        every_node([made[0], made[1]], lambda i, r: r.circulate(i, i))
    finally:
        made[0].close()
        made[1].close()


def test_a_silent_neighbour_breaks_the_ring_with_its_reason():
    a, b = rings(2)
    b.close()
    with pytest.raises(RingBroke, match="previous node closed"):
        a.recv()
    a.close()


def cluster(nodes: int, base: int, tmp_path: Path, unreachable: int | None = None):
    """Nodes that are this machine on 127.0.x addresses (a node `unreachable` declares an address
    nothing listens on from here: another network)."""
    listed = [SimpleNamespace(name=f"q-{i}", private_ip="127.0.0.1" if i != unreachable else "192.0.2.1")
              for i in range(nodes)]
    outputs = SimpleNamespace(nodes=listed, rdzv_port=base, tier_gbps=1.0)
    lines: list[str] = []
    return SimpleNamespace(outputs=outputs, log=lines.append, lines=lines,
                           transports=lambda: [LocalTransport(n.name) for n in listed])


def test_the_program_measures_on_the_system_python_with_nothing_installed(tmp_path, monkeypatch):
    base = free_base(3)
    found = cluster(3, base, tmp_path)
    options = NetcheckOptions(quick=True, max_size=4 << 20, p2p_tool="socket")
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the system Python sees no fatpipe: all is sent
    result = run_quick(found, tmp_path, options, remote_python="/usr/bin/python3")
    assert result["backend"] == "tcp" and result["world_size"] == 3 and result["busbw_size"] == 4 << 20
    [row] = result["allreduce"]
    assert row["busbw_gbps"] > 0 and result["latency_s"] > 0
    assert [(r["client"], r["server"]) for r in result["p2p"]["results"]] == [("q-1", "q-0"), ("q-2", "q-0")]
    assert all(r["gbps"] > 0 and not r.get("error") for r in result["p2p"]["results"])
    assert "ring of TCP sockets" in (tmp_path / "node-0.log").read_text()
    assert ring_port(found.outputs, 2) == base + 8


def test_a_node_that_cannot_join_is_named_and_nothing_is_left_running(tmp_path):
    base = free_base(3)
    found = cluster(3, base, tmp_path, unreachable=2)
    options = NetcheckOptions(quick=True, max_size=1 << 20, p2p_tool="socket", timeout_s=4)
    started = time.monotonic()
    with pytest.raises(FatpipeError, match=r"quick check failed: q-[12]: .*ring broke"):
        run_quick(found, tmp_path, options, remote_python="python3")
    assert time.monotonic() - started < 30
    # The programs that joined were stopped: their ends of the ring listen no more.
    assert not any(is_listening("127.0.0.1", ring_port(found.outputs, i)) for i in (0, 1))
