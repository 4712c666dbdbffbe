"""Point-to-point TCP throughput between two nodes: iperf3 where present, else a built-in socket test.

Runs on a node with the standard library only:

    python -m fatpipe.trainer.net.p2p server --bind 10.42.0.10 --port 5201
    python -m fatpipe.trainer.net.p2p client --connect 10.42.0.10 --port 5201 --streams 4 --seconds 3

The client prints one JSON line. `gbps` is always measured on the receiving side (bytes that
arrived over the time between the first and the last byte), like iperf3's `sum_received`.
This module picks the tool and runs its server as a child process; the tools themselves are
`iperf3` and `p2psocket` (the built-in protocol).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from fatpipe.trainer.net.iperf3 import have_iperf3, iperf3_client, iperf3_server_command
from fatpipe.trainer.net.p2psocket import CHUNK, serve, socket_client

# Names other code and tests import from here, though they now live in the modules above.
__all__ = [
    "CHUNK", "DEFAULT_PORT", "TOOLS", "have_iperf3", "iperf3_client", "iperf3_server_command",
    "is_listening", "main", "resolve_tool", "run_client", "serve", "socket_client",
    "start_server", "stop_server", "wait_listening",
]

DEFAULT_PORT = 5201
TOOLS = ("auto", "iperf3", "socket")


# --- choosing the tool and running its server ------------------------------------------------


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
        cmd = [sys.executable, "-m", "fatpipe.trainer.net.p2p", "server", "--bind", bind,
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
    parser = argparse.ArgumentParser(prog="python -m fatpipe.trainer.net.p2p", description=__doc__.split("\n")[0])
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
            # Become iperf3, so that stopping this server stops it (a child would outlive us).
            cmd = iperf3_server_command(args.bind, args.port)
            os.execvp(cmd[0], cmd)
        serve(args.bind, args.port, sessions=args.sessions, idle_timeout=args.idle_timeout)
        return 0
    result = run_client(resolve_tool(args.tool), args.connect, args.port, args.streams,
                        args.seconds, bind=args.bind)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
