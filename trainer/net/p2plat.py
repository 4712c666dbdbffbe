"""Round-trip latency and jitter between two nodes over TCP (standard library only).

A node answers on an echo listener (`EchoServer`, a thread in the benchmark's own process);
its peer sends many small messages, one at a time, and times each round trip (`rtt_stats`).
Small messages with TCP_NODELAY measure the path and the two stacks, not the link's bandwidth:
the same question `mtr` answers, inside one private network.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

MESSAGE_BYTES = 64


class EchoServer:
    """Echo every connection's bytes back until it closes; one thread per connection."""

    def __init__(self, bind: str, port: int):
        self.listener = socket.create_server((bind, port), backlog=16)
        self.listener.settimeout(0.5)  # so `close` is noticed without a connection
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="p2p-echo", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.listener.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(60)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while data := conn.recv(4096):
                conn.sendall(data)
        except OSError:
            pass  # the peer went away: nothing to answer


def rtt_samples(host: str, port: int, count: int, warmup: int = 10, bind: str | None = None,
                connect_timeout: float = 10.0) -> list[float]:
    """Seconds per round trip of a MESSAGE_BYTES message, `count` of them after `warmup`."""
    source = (bind, 0) if bind else None
    deadline = time.monotonic() + connect_timeout
    while True:  # the peer's listener starts at about the same time: retry a refusal
        try:
            conn = socket.create_connection((host, port), timeout=5, source_address=source)
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
    payload = bytes(MESSAGE_BYTES)
    samples: list[float] = []
    with conn:
        conn.settimeout(30)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(warmup + count):
            start = time.perf_counter()
            conn.sendall(payload)
            got = 0
            while got < MESSAGE_BYTES:
                chunk = conn.recv(MESSAGE_BYTES - got)
                if not chunk:
                    raise ConnectionError(f"{host}:{port} closed the echo connection")
                got += len(chunk)
            if i >= warmup:
                samples.append(time.perf_counter() - start)
    return samples


def rtt_stats(samples: list[float]) -> dict:
    """p50, p95 and jitter (p95 - p50, the spread a collective's latency sees) and the stddev."""
    if not samples:
        raise ValueError("no round trips to summarize")
    ordered = sorted(samples)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    p50, p95 = pct(0.5), pct(0.95)
    return {"rtt_p50_s": p50, "rtt_p95_s": p95, "jitter_s": p95 - p50,
            "rtt_stddev_s": statistics.pstdev(ordered), "rtt_count": len(ordered),
            "rtt_bytes": MESSAGE_BYTES}
