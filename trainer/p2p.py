"""Point-to-point TCP throughput between two nodes: iperf3 where present, else a built-in socket test.

Runs on a node with the standard library only:

    python -m fatpipe.trainer.p2p server --bind 10.42.0.10 --port 5201
    python -m fatpipe.trainer.p2p client --connect 10.42.0.10 --port 5201 --streams 4 --seconds 3

The client prints one JSON line. `gbps` is always measured on the receiving side (bytes that
arrived over the time between the first and the last byte), like iperf3's `sum_received`.

The built-in protocol: the client opens a control connection and sends `{"streams": N}`; the
server answers `{"ok": true}`, accepts N data connections, reads them to EOF and sends its
receiver-side count back on the control connection. Sessions run one at a time.
"""

from __future__ import annotations

import argparse
import json
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time

CHUNK = 1 << 20  # bytes per send/recv call: large enough that Python's overhead is noise
DEFAULT_PORT = 5201
TOOLS = ("auto", "iperf3", "socket")


def have_iperf3() -> bool:
    return shutil.which("iperf3") is not None


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


# --- iperf3 ----------------------------------------------------------------------------------


def iperf3_server_command(bind: str, port: int) -> list[str]:
    return ["iperf3", "--server", "--bind", bind, "--port", str(port)]


def iperf3_client(
    host: str, port: int, streams: int = 1, seconds: float = 3.0, bind: str | None = None,
    connect_timeout: float = 10.0,
) -> dict:
    """Run `iperf3 -c ... -J` and return its receiver-side sum."""
    cmd = ["iperf3", "--client", host, "--port", str(port), "--json",
           "--time", str(max(1, round(seconds))), "--parallel", str(streams)]
    if bind:
        cmd += ["--bind", bind]
    deadline = time.monotonic() + connect_timeout
    while True:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
        try:
            report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            report = {"error": proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}"}
        # A server that is still starting, or busy finishing the previous test, refuses us.
        if "error" not in report or time.monotonic() >= deadline:
            break
        time.sleep(0.3)
    if "error" in report:
        raise RuntimeError(f"iperf3 to {host}:{port}: {report['error']}")
    end = report["end"]
    received, sent = end["sum_received"], end["sum_sent"]
    return {"tool": "iperf3", "streams": streams, "bytes": int(received["bytes"]),
            "seconds": float(received["seconds"]), "gbps": received["bits_per_second"] / 1e9,
            "sender_gbps": sent["bits_per_second"] / 1e9}


def resolve_tool(tool: str, peers_have_iperf3: bool = True) -> str:
    """`auto` means iperf3 when this node and its peer both have it, else the socket test."""
    if tool == "auto":
        return "iperf3" if have_iperf3() and peers_have_iperf3 else "socket"
    return tool


def start_server(tool: str, bind: str, port: int, idle_timeout: float = 120.0) -> subprocess.Popen:
    """Start a p2p server as a child process (stop it with `stop_server`)."""
    if tool == "iperf3":
        cmd = iperf3_server_command(bind, port)
    else:
        cmd = [sys.executable, "-m", "fatpipe.trainer.p2p", "server", "--bind", bind,
               "--port", str(port), "--idle-timeout", str(idle_timeout)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_listening(proc: subprocess.Popen, bind: str, port: int, timeout: float = 10.0) -> str | None:
    """None once `proc` listens on bind:port, else why not (it exited, or never got there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            return f"the server exited ({err[-1] if err else f'status {proc.returncode}'})"
        if is_listening(bind, port):
            return None
        time.sleep(0.05)
    return f"the server did not listen on {bind}:{port} within {timeout:g} s"


def is_listening(bind: str, port: int) -> bool:
    """Whether this network namespace has a TCP socket listening on bind:port (or 0.0.0.0:port)."""
    wanted = {f"{_hex_ip(bind)}:{port:04X}", f"00000000:{port:04X}"}
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            return any(fields[1] in wanted and fields[3] == "0A" for fields in map(str.split, f))
    except OSError:  # not Linux: let the client's retries cover the start-up
        time.sleep(0.5)
        return True


def _hex_ip(ip: str) -> str:
    """/proc/net/tcp's form of an IPv4 address: the 32-bit value in host (little-endian) order."""
    return socket.inet_aton(ip)[::-1].hex().upper()


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def run_client(tool: str, host: str, port: int, streams: int, seconds: float,
               bind: str | None = None, connect_timeout: float = 10.0) -> dict:
    client = iperf3_client if tool == "iperf3" else socket_client
    return client(host, port, streams=streams, seconds=seconds, bind=bind,
                  connect_timeout=connect_timeout)


# --- command line ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fatpipe.trainer.p2p", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    server = sub.add_parser("server", help="answer throughput tests")
    server.add_argument("--bind", required=True, help="private IP to listen on")
    server.add_argument("--port", type=int, default=DEFAULT_PORT)
    server.add_argument("--tool", choices=TOOLS, default="socket")
    server.add_argument("--sessions", type=int, default=0, help="exit after this many (0: until idle)")
    server.add_argument("--idle-timeout", type=float, default=120.0)
    client = sub.add_parser("client", help="send to a server and print the throughput as JSON")
    client.add_argument("--connect", required=True, help="the server's private IP")
    client.add_argument("--port", type=int, default=DEFAULT_PORT)
    client.add_argument("--bind", default=None, help="private IP to send from")
    client.add_argument("--tool", choices=TOOLS, default="auto")
    client.add_argument("--streams", type=int, default=1)
    client.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)

    if args.mode == "server":
        tool = resolve_tool(args.tool)
        if tool == "iperf3":
            return subprocess.run(iperf3_server_command(args.bind, args.port)).returncode
        serve(args.bind, args.port, sessions=args.sessions, idle_timeout=args.idle_timeout)
        return 0
    result = run_client(resolve_tool(args.tool), args.connect, args.port, args.streams,
                        args.seconds, bind=args.bind)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
