"""This process's TCP connections and the rate each one delivered while it had data to send.

A ring all-reduce paces every node to its slowest link, so a node's NIC counters look the same
whichever node is slow. Linux's per-socket TCP_INFO does not: `bytes_acked` over the time the
socket was busy sending (`busy_time` less the time the receiver's window held it, both since
Linux 4.10) is the rate of that one path. The sockets are the backend's own (gloo, NCCL's
socket transport), read from /proc/self/fd with getsockopt on a duplicate: nothing is sent.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

# Offsets in struct tcp_info (linux/tcp.h; the struct only ever grows at its end).
_ACKED = 120  # __u64 tcpi_bytes_acked
_BUSY = 168  # __u64 tcpi_busy_time, tcpi_rwnd_limited, tcpi_sndbuf_limited (microseconds)
_NEEDED = _BUSY + 24
MIN_BYTES = 1 << 20  # a pair that sent less in a window says nothing about its link
MIN_BUSY_US = 500


def _peer_ip(address: str) -> str:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def tcp_counters() -> dict[str, tuple[int, int]]:
    """Peer IP -> (bytes acked, microseconds busy sending, less receiver-window stalls), summed
    over this process's TCP connections to that peer; {} where this cannot be read."""
    out: dict[str, tuple[int, int]] = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            peer = _peer_ip(sock.getpeername()[0])
        except (OSError, ValueError):  # a listening or closing socket has no peer
            continue
        finally:
            sock.close()
        if len(raw) < _NEEDED:  # a kernel older than 4.10
            continue
        (acked,) = struct.unpack_from("Q", raw, _ACKED)
        busy, rwnd, _ = struct.unpack_from("QQQ", raw, _BUSY)
        had = out.get(peer, (0, 0))
        # Connections to one peer run side by side: their busy times overlap, so keep the longest.
        out[peer] = (had[0] + acked, max(had[1], busy - rwnd))
    return out


def peer_rates(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Peer IP -> Gbit/s this process delivered to it while busy, between two `tcp_counters`."""
    rates = {}
    for peer, (acked, busy) in after.items():
        acked0, busy0 = before.get(peer, (0, 0))
        sent, busy_us = acked - acked0, busy - busy0
        if sent >= MIN_BYTES and busy_us >= MIN_BUSY_US:
            rates[peer] = sent * 8 / (busy_us * 1e-6) / 1e9
    return rates
