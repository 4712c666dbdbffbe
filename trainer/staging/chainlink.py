"""The staging chain's links: one TCP connection from each node to the next, on the private addresses.

Standard library only: the chain runs with the node's system Python before any venv (no torch).
Each node listens on the address the operator named for it (`--listen`) and connects to the next
one's (`--next`); the first line on a connection is the push's token, which the operator sent every
node on its standard input, so a stray connection on the private network is dropped unheard. A
message is a header (kind, tag, length) and its bytes. Control messages (what each node holds, the
reports) travel back up the same connection the data travels down. The first node's link to the
chain's head, the operator, is its own standard input and output (`StdioLink`): the ssh session
the operator started it with, so no port is opened towards the operator.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import select
import socket
import struct
import sys
import threading
import time

HEADER = struct.Struct("!4sQI")  # kind, tag, length
TOKEN_ENV = "FATPIPE_CHAIN_TOKEN"
CONNECT_RETRY_S = 0.1
UP_PREFIX = "STAGE_UP "  # a message to the operator: the first node's output line, base64


class ChainBroke(RuntimeError):
    """A neighbour went away or said something the chain does not expect."""


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def token() -> bytes:
    return os.environ.get(TOKEN_ENV, "").encode()


def listen(at: str) -> socket.socket:
    host, port = address(at)
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)


def accept_previous(server: socket.socket, deadline: float) -> socket.socket:
    """The previous node's connection: the first one that says the push's token."""
    want = token() + b"\n"
    while True:
        server.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, _ = server.accept()
        except TimeoutError:
            raise ChainBroke("the previous node never connected") from None
        conn.settimeout(30)
        try:
            said = recv_exact(conn, len(want))
        except (OSError, ChainBroke):
            said = b""
        if said == want:
            conn.settimeout(None)
            return conn
        conn.close()


def connect_next(at: str, deadline: float) -> socket.socket:
    """Connect to the next node, retrying while its program starts."""
    while True:
        try:
            conn = socket.create_connection(address(at), timeout=10)
        except OSError as e:
            if time.monotonic() > deadline:
                raise ChainBroke(f"cannot reach the next node at {at}: {e}") from None
            time.sleep(CONNECT_RETRY_S)
            continue
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(token() + b"\n")
        conn.settimeout(None)
        return conn


class StdioLink:
    """The first node's link to the operator: bytes down on the standard input, messages up as lines.

    The program's own first line (node/databoot.py) is read before this link is made, and the operator
    sends nothing after it until this node's first message up (what the chain holds), so no byte of
    the chain waits in that line's read buffer: the descriptor is read raw from here on. Only small
    messages go up (what is held, the report); the data only comes down."""

    def __init__(self):
        self.timeout: float | None = None

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def recv_into(self, view: memoryview) -> int:
        if self.timeout is not None and not select.select([0], [], [], self.timeout)[0]:
            raise TimeoutError(f"nothing came from the operator within {self.timeout:.0f} s")
        return os.readv(0, [view])

    def sendall(self, data: bytes) -> None:
        sys.stdout.write(UP_PREFIX + base64.b64encode(data).decode() + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        pass


def recv_exact(conn: socket.socket, n: int, into: memoryview | None = None) -> bytes:
    view = into if into is not None else memoryview(bytearray(n))
    got = 0
    while got < n:
        k = conn.recv_into(view[got:n])
        if not k:
            raise ChainBroke("a neighbour closed the connection")
        got += k
    return bytes(view[:n]) if into is None else b""


def send_message(conn: socket.socket, kind: bytes, payload) -> None:
    body = json.dumps(payload).encode()
    conn.sendall(HEADER.pack(kind, 0, len(body)) + body)


def recv_message(conn: socket.socket, kind: bytes, timeout: float):
    conn.settimeout(timeout)
    got, _, length = HEADER.unpack(recv_exact(conn, HEADER.size))
    if got != kind:
        raise ChainBroke(f"expected {kind.decode()}, got {got.decode(errors='replace')}")
    body = recv_exact(conn, length)
    conn.settimeout(None)
    return json.loads(body)


class Pool:
    """A fixed set of piece buffers: the node's staging memory is these and nothing that grows."""

    def __init__(self, count: int, size: int):
        self.free: queue.Queue = queue.Queue()
        for _ in range(count):
            self.free.put(bytearray(size))

    def take(self, timeout: float) -> bytearray:
        try:
            return self.free.get(timeout=timeout)
        except queue.Empty:
            raise ChainBroke(f"no piece buffer came free within {timeout:.0f} s") from None


def move(tasks, files, check, links, progress, timeout: float, buffers: int) -> int:
    """Move this node's pieces (`stage.Task`s): received from `links[0]` or read from disk, written
    and checked where this node takes the chunk, sent on to `links[1]`. A thread receives and a
    thread sends while this one writes, so piece k arrives while piece k - 1 goes on; returns the
    bytes received."""
    if not tasks:
        return 0
    size = max(t.length for t in tasks)
    incoming = Pool(max(1, buffers - 2), size)  # receive pieces ahead while one is written and sent
    own = Pool(2, size)  # pieces read from disk: their own buffers, so receiving never starves them
    arrived: queue.Queue = queue.Queue()
    outgoing: queue.Queue = queue.Queue()
    failed: list[BaseException] = []

    def receive() -> None:
        try:
            for task in (t for t in tasks if t.receive):
                buf = incoming.take(timeout)
                links[0].settimeout(timeout)
                kind, tag, length = HEADER.unpack(recv_exact(links[0], HEADER.size))
                if kind != b"DATA" or tag != task.tag or length != task.length:
                    raise ChainBroke(f"expected piece {task.tag}, got {kind.decode(errors='replace')} {tag}")
                recv_exact(links[0], length, memoryview(buf))
                arrived.put(buf)
        except BaseException as e:  # handed to the main thread, which says it
            failed.append(e)
            arrived.put(None)

    def send() -> None:
        try:
            while (item := outgoing.get()) is not None:
                task, buf, pool = item
                links[1].sendall(HEADER.pack(b"DATA", task.tag, task.length))
                links[1].sendall(memoryview(buf)[:task.length])
                pool.free.put(buf)
        except BaseException as e:
            failed.append(e)

    threads = [threading.Thread(target=receive, daemon=True), threading.Thread(target=send, daemon=True)]
    for thread in threads:
        thread.start()
    received = 0
    try:
        for task in tasks:
            if failed:
                raise failed[0]
            if task.receive:
                buf, pool = arrived.get(timeout=timeout), incoming
                if buf is None:
                    raise failed[0]
                received += task.length
            else:
                buf, pool = own.take(timeout), own
                files.read(task, memoryview(buf)[:task.length])
            data = memoryview(buf)[:task.length]
            if task.write:
                handle = files.partial(task.file)
                handle.seek(task.offset)
                handle.write(data)
                check.feed(task.file, task.offset, data)
            if task.send:
                outgoing.put((task, buf, pool))
            else:
                pool.free.put(buf)
            progress(received)
    except queue.Empty:
        raise ChainBroke(f"no piece arrived within {timeout:.0f} s") from None
    finally:
        outgoing.put(None)
        threads[1].join(timeout=timeout)
    if failed:
        raise failed[0]
    return received
