"""The network interface that carries this process group's traffic, and its byte counters.

Which interface: the one named by GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME when set (that is
what the backends bind to), else the one holding the local address the kernel would use to
reach MASTER_ADDR, else `lo`. psutil is used when installed; without it (node venvs hold torch
and little else) the same facts come from Linux's /proc and ioctl.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import time

from fatpipe.node.env import NodeEnv

try:
    import psutil
except ImportError:  # optional: node venvs hold torch and little else
    psutil = None

_SIOCGIFADDR = 0x8915


def interface_addresses() -> dict[str, list[str]]:
    """Interface name -> its IP addresses."""
    if psutil is None:
        return _linux_interface_addresses()
    return {name: [a.address for a in addrs] for name, addrs in psutil.net_if_addrs().items()}


def ipv4_address(name: str) -> str | None:
    """The IPv4 address of interface `name` (Linux SIOCGIFADDR), or None if it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no such interface, or no IPv4 address
            return None
    return socket.inet_ntoa(req[20:24])


def _linux_interface_addresses() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {name: [] for _, name in socket.if_nameindex()}
    for name in found:
        ip = ipv4_address(name)
        if ip:
            found[name].append(ip)
    try:
        with open("/proc/net/if_inet6") as f:  # "<32 hex digits> idx plen scope flags name"
            for line in f:
                parts = line.split()
                found.setdefault(parts[5], []).append(str(ipaddress.IPv6Address(int(parts[0], 16))))
    except OSError:
        pass
    return found


def interface_counters(name: str) -> tuple[int, int]:
    """(bytes sent, bytes received) by one interface since boot; (0, 0) if unknown."""
    if psutil is None:
        try:
            with open("/proc/net/dev") as f:
                for line in f:
                    nic, sep, fields = line.partition(":")
                    if sep and nic.strip() == name:
                        values = fields.split()
                        return int(values[8]), int(values[0])
        except OSError:
            pass
        return 0, 0
    c = psutil.net_io_counters(pernic=True).get(name)
    return (c.bytes_sent, c.bytes_recv) if c else (0, 0)


def traffic_interface(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    nics = interface_addresses()
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
    local_ip = source_address(env.get("MASTER_ADDR", ""))
    if local_ip:
        for name, addrs in nics.items():
            if any(_same_ip(a, local_ip) for a in addrs):
                return name
        if _is_loopback(local_ip):  # 127.0.0.x beyond .1 belongs to lo without being listed
            return next((n for n, addrs in nics.items() if any(map(_is_loopback, addrs))), "lo")
    return "lo"


def source_address(host: str, family: int = socket.AF_UNSPEC) -> str | None:
    """The local IP the kernel routes to `host` from (a UDP connect sends nothing), or None."""
    if not host:
        return None
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 1, family, proto=socket.IPPROTO_UDP)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError:
        return None


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip.split("%")[0]).is_loopback
    except ValueError:
        return False


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.split("%")[0]) == ipaddress.ip_address(b.split("%")[0])
    except ValueError:
        return False


class NicMeter:
    """Gbit/s sent and received on one interface, read at most every `every_s` seconds.

    Reading the counters costs milliseconds on a busy machine (/proc/net/dev is read whole), so
    a step between two readings gets the rates of the last window: a step shorter than a
    second records the interface's rate over the last second, not over the step itself.
    """

    def __init__(self, interface: str, every_s: float = 1.0):
        self.interface, self.every_s = interface, every_s
        self._last = self._read()
        self._rates: tuple[float, float] | None = None

    def _read(self) -> tuple[float, int, int]:
        return (time.perf_counter(), *interface_counters(self.interface))

    def rates(self) -> tuple[float, float]:
        """(tx_gbps, rx_gbps) over the last window (at the first call: since the meter began)."""
        if self._rates is not None and time.perf_counter() - self._last[0] < self.every_s:
            return self._rates
        now = self._read()
        dt = max(now[0] - self._last[0], 1e-9)
        tx, rx = (now[1] - self._last[1]) * 8 / dt / 1e9, (now[2] - self._last[2]) * 8 / dt / 1e9
        self._last, self._rates = now, (tx, rx)
        return tx, rx


def node_ip() -> str:
    """This node's private IP: $FATPIPE_PRIVATE_IP (the launch path's node env), else the
    address of $GLOO_SOCKET_IFNAME, else the source address the kernel picks to reach the
    rendezvous host."""
    private_ip = NodeEnv.from_environ().private_ip
    if private_ip:
        return private_ip
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        name = os.environ.get(var, "").lstrip("=")
        if name and "," not in name and not name.startswith("^"):
            ip = ipv4_address(name)
            if ip:
                return ip
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    ip = source_address(host, socket.AF_INET)
    if ip is None:
        raise OSError(f"no IPv4 route to the rendezvous host {host}")
    return ip
