"""The built-in TCP throughput test (standard library only), for nodes without iperf3.

The protocol: the client opens a control connection and sends `{"streams": N}`; the server
answers `{"ok": true}`, accepts N data connections, reads them to EOF and sends its
receiver-side count back on the control connection. Sessions run one at a time. `gbps` is
measured on the receiving side (bytes that arrived over the time between the first and the
last byte), like iperf3's `sum_received`.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import threading
import time

CHUNK = 1 << 20  # bytes per send/recv call: large enough that Python's overhead is noise


# --- the built-in server ---------------------------------------------------------------------


def serve(bind: str, port: int, sessions: int = 0, idle_timeout: float = 120.0, ready=None) -> None:
    """Answer `sessions` client sessions (0: until idle for `idle_timeout` seconds)."""
    with socket.create_server((bind, port), backlog=64, reuse_port=False) as listener:
        listener.settimeout(idle_timeout)
        if ready is not None:
            ready()
        done = 0
        while sessions == 0 or done < sessions:
            try:
                control, _ = listener.accept()
            except TimeoutError:
                return  # nobody came: the orchestrator is gone, do not linger
            with control:
                try:
                    _session(listener, control)
                except (OSError, ValueError) as e:
                    print(f"p2p server: session failed: {e}", file=sys.stderr)
            done += 1


def _session(listener: socket.socket, control: socket.socket) -> None:
    control.settimeout(30)
    request = json.loads(_readline(control))
    streams = int(request["streams"])
    control.sendall(b'{"ok": true}\n')
    data = []
    for _ in range(streams):
        conn, _ = listener.accept()
        data.append(conn)
    control.sendall((json.dumps(_receive(data)) + "\n").encode())


def _receive(conns: list[socket.socket]) -> dict:
    """Read every data connection to EOF; count bytes between the first and the last one."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    first = last = None
    with selectors.DefaultSelector() as sel:
        for conn in conns:
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
        open_count = len(conns)
        while open_count:
            events = sel.select(timeout=30)
            if not events:
                raise TimeoutError("no data for 30 s")
            for key, _ in events:
                try:
                    n = key.fileobj.recv_into(view)
                except BlockingIOError:
                    continue
                now = time.perf_counter()
                if n == 0:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    open_count -= 1
                    continue
                if first is None:
                    first = now
                last = now
                total += n
    seconds = (last - first) if first is not None else 0.0
    gbps = total * 8 / seconds / 1e9 if seconds > 0 else 0.0
    return {"bytes": total, "seconds": seconds, "gbps": gbps}


def _readline(sock: socket.socket, limit: int = 65536) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ValueError("connection closed before a full line")
        data += chunk
        if len(data) > limit:
            raise ValueError("line too long")
    return data.decode()


# --- the built-in client ---------------------------------------------------------------------


def socket_client(
    host: str, port: int, streams: int = 1, seconds: float = 3.0, bind: str | None = None,
    connect_timeout: float = 10.0,
) -> dict:
    """Send for `seconds` over `streams` connections; return the server's receiver-side count."""
    source = (bind, 0) if bind else None
    control = _connect_retry(host, port, source, connect_timeout)
    with control:
        control.settimeout(30)
        control.sendall((json.dumps({"streams": streams}) + "\n").encode())
        json.loads(_readline(control))
        conns = [socket.create_connection((host, port), timeout=30, source_address=source)
                 for _ in range(streams)]
        sent = [0] * streams
        deadline = time.monotonic() + seconds
        threads = [threading.Thread(target=_send_until, args=(c, deadline, sent, i))
                   for i, c in enumerate(conns)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        control.settimeout(seconds + 60)
        result = json.loads(_readline(control))
    result.update(tool="socket", streams=streams,
                  sender_gbps=sum(sent) * 8 / elapsed / 1e9 if elapsed > 0 else 0.0)
    return result


def _send_until(conn: socket.socket, deadline: float, sent: list[int], index: int) -> None:
    payload = memoryview(bytes(CHUNK))
    with conn:
        while time.monotonic() < deadline:
            conn.sendall(payload)
            sent[index] += CHUNK
        conn.shutdown(socket.SHUT_WR)  # FIN after the queued bytes: the receiver sees EOF


def _connect_retry(host, port, source, timeout: float) -> socket.socket:
    # The server is started on another node at about the same time: retry a refused connection.
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=5, source_address=source)
        except (ConnectionRefusedError, TimeoutError, OSError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)

