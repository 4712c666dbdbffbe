"""`python -m fatpipe.trainer.live.lighthouse`: torchft's Lighthouse, the quorum's coordinator.

It runs on the leader node under the node's supervisor, bound to the node's private address
only (the firewall admits that network alone), and holds no training state: killed and started
again on the same address, the replica groups' managers reconnect and the next quorum forms
(docs/ARCHITECTURE.md, "Live fault tolerance"). It imports no torch: it starts in a second.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading

# A replica that misses heartbeats this long is out of the next quorum. The managers beat every
# 100 ms; 3 s rides out a loaded machine's stalls (1 s made false leaves under the test suite).
HEARTBEAT_TIMEOUT_MS = 3000
# How long a quorum waits for a replica that beats but has not asked to join: a returning node
# is let in at most this late, and only when it started its step in that time.
JOIN_TIMEOUT_MS = 10000


def bind_address(host: str, port: int) -> str:
    """host:port as the Lighthouse binds it; an IPv6 address in brackets."""
    ip = ipaddress.ip_address(host)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fatpipe.trainer.live.lighthouse",
                                description="torchft's Lighthouse on a private address")
    p.add_argument("--host", required=True, help="the node's private IP address")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=HEARTBEAT_TIMEOUT_MS)
    p.add_argument("--join-timeout-ms", type=int, default=JOIN_TIMEOUT_MS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        bind = bind_address(args.host, args.port)
    except ValueError:
        print(f"lighthouse: error: --host {args.host!r} is not an IP address", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536 or args.min_replicas < 1:
        print("lighthouse: error: --port must be 1-65535 and --min-replicas >= 1", file=sys.stderr)
        return 2
    # Quorum changes (a join, a leave) at info; not every step's requests.
    os.environ.setdefault("RUST_LOG", "torchft::lighthouse=info,warn")
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind=bind, min_replicas=args.min_replicas,
                              join_timeout_ms=args.join_timeout_ms,
                              heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    print(f"lighthouse: serving on {bind} (min replicas {args.min_replicas}, heartbeat timeout "
          f"{args.heartbeat_timeout_ms} ms, join timeout {args.join_timeout_ms} ms)", flush=True)
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
