"""A ring all-reduce over plain TCP sockets, standard library only: the quick link check's
measurement where no torch runs (`fatpipe.trainer.net.quick`; docs/netcheck.md, "The quick check").

Node i listens for node i-1 and connects to node i+1. A buffer's N chunks go round the ring as
gloo's and NCCL's ring all-reduce sends them (N-1 reduce steps, then N-1 gather steps: 2(N-1)/N of
the buffer leaves every node), in pieces, so a piece goes on while the next one arrives. A checked
all-reduce reduces with XOR (Python's ints, C speed) and proves every piece came to its place;
a timed one moves the same bytes in the same order without arithmetic: Python's XOR (about 3 GB/s
here) would cap a 10 Gbit/s link where gloo's float add (memory speed) does not. Control messages
(length-prefixed JSON) travel the same two sockets between the timed parts.
"""

from __future__ import annotations

import hmac
import json
import queue
import socket
import struct
import threading
import time

PIECE = 1 << 20  # bytes per send and receive: large for Python's overhead, small for the pipeline
_LENGTH = struct.Struct("!I")


class RingBroke(Exception):
    """A neighbour closed its connection, sent what the ring does not expect, or went silent."""


def xor(a, b) -> bytes:
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")


def _connect(to: tuple[str, int], source: str, deadline: float) -> socket.socket:
    while True:  # the next node starts its program at about the same time: retry until it listens
        try:
            return socket.create_connection(to, timeout=5, source_address=(source, 0))
        except OSError:
            if time.monotonic() >= deadline:
                raise RingBroke(f"could not connect to the next node at {to[0]}:{to[1]}") from None
            time.sleep(0.1)


class Ring:
    """This node's place in the ring: `prev` (from node i-1) and `next` (to node i+1)."""

    def __init__(self, listen: tuple[str, int], to: tuple[str, int], token: str, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET  # a private IPv6 address too
        with socket.create_server(listen, family=family, backlog=8) as server:
            self.next = _connect(to, listen[0], deadline)
            self.next.sendall(_LENGTH.pack(len(token)) + token.encode())
            self.prev = self._accept(server, token, deadline)
        for sock in (self.prev, self.next):
            sock.settimeout(timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @staticmethod
    def _accept(server: socket.socket, token: str, deadline: float) -> socket.socket:
        """The previous node's connection: the first one that says the check's token."""
        while True:
            server.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                conn, _ = server.accept()
            except OSError:
                raise RingBroke("the previous node did not connect") from None
            try:
                conn.settimeout(10)
                size = _LENGTH.unpack(_recv_exact(conn, bytearray(4)))[0]
                if size <= 256 and hmac.compare_digest(bytes(_recv_exact(conn, bytearray(size))), token.encode()):
                    return conn
            except (OSError, RingBroke):
                pass
            conn.close()  # not a member of this check

    def close(self) -> None:
        for sock in (self.next, self.prev):
            sock.close()

    # --- control messages ----------------------------------------------------------------------

    def send(self, obj) -> None:
        data = json.dumps(obj).encode()
        self.next.sendall(_LENGTH.pack(len(data)) + data)

    def recv(self):
        size = _LENGTH.unpack(_recv_exact(self.prev, bytearray(4)))[0]
        return json.loads(bytes(_recv_exact(self.prev, bytearray(size))))

    def circulate(self, place: int, mine) -> list:
        """Every node's `mine`, in place order, on every node: one lap gathers, one hands out."""
        if place == 0:
            self.send([mine])
            everyone = self.recv()
            self.send(everyone)
            self.recv()
            return everyone
        everyone = self.recv() + [mine]
        self.send(everyone)
        everyone = self.recv()
        self.send(everyone)
        return everyone

    # --- the all-reduce --------------------------------------------------------------------------

    def allreduce(self, buf: bytearray, place: int, nodes: int, reduce: bool) -> None:
        """All-reduce `buf` (its length a multiple of `nodes`) round the ring, in place: XOR when
        `reduce`, else the same bytes moved with no arithmetic."""
        chunk = len(buf) // nodes
        view = memoryview(buf)

        def pieces(c: int) -> list[tuple[int, int]]:
            start = (c % nodes) * chunk
            return [(at, min(at + PIECE, start + chunk)) for at in range(start, start + chunk, PIECE)]

        steps = 2 * (nodes - 1)
        outgoing: queue.SimpleQueue = queue.SimpleQueue()
        failed: list[BaseException] = []
        sender = threading.Thread(target=self._send_pieces, args=(outgoing, failed), daemon=True)
        sender.start()
        for piece in pieces(place):
            outgoing.put(view[piece[0]:piece[1]])
        scratch = bytearray(min(PIECE, chunk))
        try:
            for step in range(steps):
                gather = step >= nodes - 1
                c = place - (step - nodes + 1) if gather else place - step - 1
                for a, b in pieces(c):
                    if reduce and not gather:
                        buf[a:b] = xor(buf[a:b], _recv_exact(self.prev, memoryview(scratch)[:b - a]))
                    else:
                        _recv_exact(self.prev, view[a:b])
                    if step < steps - 1:
                        outgoing.put(view[a:b])  # a region is written again only after it went round
        finally:
            outgoing.put(None)
            sender.join(timeout=60)
        if failed:
            raise RingBroke(f"sending to the next node failed: {failed[0]}")

    def _send_pieces(self, outgoing: queue.SimpleQueue, failed: list) -> None:
        while (piece := outgoing.get()) is not None:
            if not failed:
                try:
                    self.next.sendall(piece)
                except OSError as e:
                    failed.append(e)


def _recv_exact(sock: socket.socket, into) -> memoryview:
    """Fill `into` (a bytearray or a memoryview of one) from `sock`; returns it as a memoryview."""
    view = memoryview(into)
    got = 0
    while got < len(view):
        try:
            n = sock.recv_into(view[got:])
        except socket.timeout:  # noqa: UP041 (a node's Python 3.8: not yet TimeoutError)
            raise RingBroke("the previous node went silent") from None
        if n == 0:
            raise RingBroke("the previous node closed its connection")
        got += n
    return view
