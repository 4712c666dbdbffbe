"""`python -m fatpipe.trainer.live.lighthouse`: torchft's Lighthouse, the quorum's coordinator,
and the node's relay to whichever Lighthouse of the run serves (`relay`).

It runs on every node under the node's supervisor (node 0 alone serves a Lighthouse in runs of
1 or 2 nodes), bound to the node's private address only (the firewall admits the nodes
alone); the relay listens on loopback. A Lighthouse holds no training state, only its quorums'
numbering and its last quorum: killed and started again, or replaced by the next node's, it
starts both anew, the replica groups' managers reconnect and the next quorum forms, under an id
of the Managers' own (`live.epochs`; docs/ARCHITECTURE.md, "Live fault tolerance"). It imports
no torch: it starts in a second.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from ..lazy import load
from .quorum import address, bind_address
from .relay import run_relay

# A replica that misses heartbeats this long is out of the next quorum. The managers beat every
# 100 ms; 3 s rides out a loaded machine's stalls (1 s made false leaves under the test suite).
HEARTBEAT_TIMEOUT_MS = 3000
# How long a quorum waits for a replica that beats but has not asked to join: a returning node
# is let in at most this late, and only when it started its step in that time.
JOIN_TIMEOUT_MS = 10000


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fatpipe.trainer.live.lighthouse",
                                description="torchft's Lighthouse on a private address, and the "
                                            "node's relay to the run's serving Lighthouse")
    p.add_argument("--host", help="the node's private IP address, where its Lighthouse serves")
    p.add_argument("--port", type=int, help="this node's Lighthouse port (none: relay only)")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=HEARTBEAT_TIMEOUT_MS)
    p.add_argument("--join-timeout-ms", type=int, default=JOIN_TIMEOUT_MS)
    p.add_argument("--relay-port", type=int, help="loopback port of the node's relay")
    p.add_argument("--lighthouses", default="",
                   help="every Lighthouse of the run, IP:PORT,... in the order they serve")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    error = _bad_arguments(args)
    if error:
        print(f"lighthouse: error: {error}", file=sys.stderr)
        return 2
    bind = bind_address(args.host, args.port) if args.port is not None else None
    lighthouses = [address(a) for a in args.lighthouses.split(",") if a]
    logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stdout)
    server = _serve(bind, args) if bind else None
    if args.relay_port is not None:
        threading.Thread(target=run_relay, args=(("127.0.0.1", args.relay_port), lighthouses),
                         daemon=True, name="relay").start()
        print(f"lighthouse: relay on 127.0.0.1:{args.relay_port} to {args.lighthouses}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    if server:
        server.shutdown()
    return 0


def _bad_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line; None when nothing is."""
    if args.port is not None:
        try:
            bind_address(args.host or "", args.port)
        except ValueError as e:
            return f"--host {e}"
        if not 0 < args.port < 65536:
            return "--port must be 1-65535"
    try:
        lighthouses = [address(a) for a in args.lighthouses.split(",") if a]
    except ValueError as e:
        return f"--lighthouses {args.lighthouses!r} must be IP:PORT,... ({e})"
    if args.relay_port is not None and not (lighthouses and 0 < args.relay_port < 65536):
        return "--relay-port must be 1-65535, with --lighthouses"
    if args.min_replicas < 1 or (args.port is None and args.relay_port is None):
        return "--min-replicas must be >= 1, and --port or --relay-port given"
    return None


def torchft_native():
    """torchft's compiled module (the Lighthouse's server), loaded from its file without the
    torchft package, whose __init__ imports torch: about 2 ms against 1.6 s of CPU, on every node
    at every start of its Lighthouse (a returning node's included)."""
    spec = importlib.util.find_spec("torchft")  # finds, runs nothing
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"_torchft{suffix}"
            if path.is_file():
                loader = importlib.machinery.ExtensionFileLoader("torchft._torchft", str(path))
                module = importlib.util.module_from_spec(
                    importlib.util.spec_from_file_location("torchft._torchft", path, loader=loader))
                loader.exec_module(module)
                return module
    return load("torchft._torchft")  # an install laid out otherwise: through the package


def _serve(bind: str, args: argparse.Namespace):
    # Warnings only: at info torchft's Lighthouse logs every quorum request and status, about ten
    # lines a step; the trainers log each change of the quorum (RUST_LOG set on the node wins).
    os.environ.setdefault("RUST_LOG", "warn")
    server = torchft_native().LighthouseServer(bind=bind, min_replicas=args.min_replicas,
                                               join_timeout_ms=args.join_timeout_ms,
                                               heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    print(f"lighthouse: serving on {bind} (min replicas {args.min_replicas}, heartbeat timeout "
          f"{args.heartbeat_timeout_ms} ms, join timeout {args.join_timeout_ms} ms)", flush=True)
    return server


if __name__ == "__main__":
    sys.exit(main())
