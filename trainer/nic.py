"""The network interface that carries this process group's traffic, and its byte counters.

Which interface: the one named by GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME when set (that is
what the backends bind to), else the one holding the local address the kernel would use to
reach MASTER_ADDR, else `lo`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time

import psutil


def traffic_interface(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    nics = psutil.net_if_addrs()
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = env.get(var, "").strip()
        if not value or value.startswith("^"):  # unset, or an NCCL exclusion list
            continue
        # A comma list; NCCL matches names by prefix unless the list starts with "=".
        exact, names = value.startswith("="), value.lstrip("=").split(",")
        for name in (n.strip() for n in names):
            matches = [name] if name in nics else [] if exact else \
                sorted(n for n in nics if name and n.startswith(name))
            if matches:
                return matches[0]
    local_ip = _source_address(env.get("MASTER_ADDR", ""))
    if local_ip:
        for name, addrs in nics.items():
            if any(_same_ip(a.address, local_ip) for a in addrs):
                return name
    return "lo"


def _source_address(host: str) -> str | None:
    """The local IP the kernel routes to `host` from (a UDP connect sends nothing)."""
    if not host:
        return None
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 1, proto=socket.IPPROTO_UDP)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError:
        return None


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.split("%")[0]) == ipaddress.ip_address(b.split("%")[0])
    except ValueError:
        return False


class NicMeter:
    """Gbit/s sent and received on one interface since the previous reading."""

    def __init__(self, interface: str):
        self.interface = interface
        self._last = self._read()

    def _read(self) -> tuple[float, int, int]:
        c = psutil.net_io_counters(pernic=True).get(self.interface)
        return time.perf_counter(), (c.bytes_sent if c else 0), (c.bytes_recv if c else 0)

    def rates(self) -> tuple[float, float]:
        """(tx_gbps, rx_gbps) averaged since the last call."""
        now = self._read()
        dt = max(now[0] - self._last[0], 1e-9)
        tx, rx = (now[1] - self._last[1]) * 8 / dt / 1e9, (now[2] - self._last[2]) * 8 / dt / 1e9
        self._last = now
        return tx, rx
