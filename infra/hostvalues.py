"""What a host value of the cluster file may hold: an address, a login, a node name, a key path.

These values reach ssh, rsync and terraform's provisioners, so each is checked before anything
runs: no leading `-` (ssh would read an option, `-oProxyCommand=...` a local command), no
whitespace, quotes or shell metacharacters. They are passed as arguments or environment, never
as shell text (docs/ARCHITECTURE.md, "Host values"); the checks are a second wall, not the only one.
"""

from __future__ import annotations

import ipaddress
import re

# A DNS name (RFC 1123 labels) or an ~/.ssh/config alias: letters, digits, '.', '-', '_',
# starting with a letter, digit or '_' (never '-': ssh would take it for an option).
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")
# A POSIX login name (the portable set, as useradd accepts it), at most 32 characters.
LOGIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
# A node name: it names folders and log prefixes here and on the node.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_address(value: str) -> str:
    """An IPv4 or IPv6 address, a host name, or an ~/.ssh/config alias."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not HOST_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a host name, an IP address or an ~/.ssh/config alias "
                         "(letters, digits, '.', '-', '_'; not starting with '-')")
    return value


def check_login(value: str) -> str:
    if not LOGIN.fullmatch(value):
        raise ValueError(f"{value!r} is not a login name (letters, digits, '_', '.', '-', "
                         "starting with a letter or '_', at most 32)")
    return value


def check_node_name(value: str) -> str:
    if not NODE_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a node name (letters, digits, '_', '.', '-', "
                         "starting with a letter or digit, at most 63)")
    return value


def check_path(value: str) -> str:
    """A file path: any characters (spaces too) but control characters such as a newline."""
    if not value or CONTROL.search(value):
        raise ValueError(f"{value!r} is not a file path (empty, or holds a control character)")
    return value


def one_host_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why `ip` cannot be one machine's own address, where its servers bind and peers dial
    (docs/security.md); None when it can. The trainer keeps its own copy
    (trainer.live.lighthouse.one_host_problem); a unit test ties the two."""
    if ip.is_unspecified:
        return f"{ip} is the unspecified address: a server bound to it listens on every interface"
    if ip.is_multicast:
        return f"{ip} is a multicast address, not one machine's"
    if ip.version == 4 and ip.is_reserved:  # 240.0.0.0/4 (IPv6's ::/8 holds ::1)
        return f"{ip} is a reserved address (the broadcast address among them), not one machine's"
    return None


def one_host(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """`ip` as text; ValueError naming why where it cannot be one machine's (`one_host_problem`)."""
    problem = one_host_problem(ip)
    if problem:
        raise ValueError(problem)
    return str(ip)
