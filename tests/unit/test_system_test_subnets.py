"""Every system test's sim cluster has a private /24 of its own.

The suite runs in two lanes at once (Makefile: LANE_ONE beside LANE_TWO); two netns or VM
clusters given the same `10.N.0.0/24` then route over each other and one test's ssh reaches the
other's node ("Permission denied"). A test module names its octet as `OCTET` (`NAME, OCTET = ...`),
an `octet=` argument, a `("name", N)` case of a `cluster` parametrization, a string that is a
`10.N.x.y` address or network, or a sim cluster's `private_cidr = "10.N...` line; no two modules
may share one.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

SYSTEM = Path(__file__).resolve().parents[1] / "system"
# A `[clusters.X]` table of a fatpipe.toml a test writes, up to the next table.
TABLE = re.compile(r"^\[clusters\.[^\]]+\]$(.*?)(?=^\[|\Z)", re.M | re.S)
CIDR = re.compile(r'private_cidr\s*=\s*\\?"10\.(\d+)\.')
# 10.42.0.0/24: the outputs of fixtures whose nodes are local, loopback (127.42...) or never
# started: no network is made for it, so modules may share it.
NO_NETWORK = {42}
ADDRESS = re.compile(r"^10\.(\d+)\.\d+\.\d+(/\d+)?$")  # a whole string: an address or a /24


def octets(path: Path) -> set[int]:
    """The octets a test module declares for its clusters."""
    text = path.read_text()
    found = {int(n) for table in TABLE.findall(text) if 'provider = "sim"' in table
             for n in CIDR.findall(table)}  # a cloud's synthesized stack makes no local network
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for name, value in zip(names, values, strict=False):
                    if isinstance(name, ast.Name) and "OCTET" in name.id and isinstance(value, ast.Constant):
                        found.add(int(value.value))
        elif isinstance(node, ast.keyword) and node.arg == "octet" and isinstance(node.value, ast.Constant):
            found.add(int(node.value.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ADDRESS.match(node.value):
            found.add(int(ADDRESS.match(node.value).group(1)))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parametrize" and node.args \
                and getattr(node.args[0], "value", None) == "cluster":  # ("name", octet) per cluster
            found |= {int(case.elts[1].value) for case in getattr(node.args[1], "elts", [])
                      if isinstance(case, ast.Tuple) and len(case.elts) > 1
                      and isinstance(case.elts[1], ast.Constant) and isinstance(case.elts[1].value, int)}
    return found


def test_no_two_system_test_modules_share_a_subnet():
    owners: dict[int, list[str]] = defaultdict(list)
    for path in sorted(SYSTEM.glob("test_*.py")):
        for octet in octets(path):
            owners[octet].append(path.name)
    shared = {f"10.{octet}.0.0/24": names for octet, names in owners.items()
              if len(names) > 1 and octet not in NO_NETWORK}
    assert not shared, f"system test modules share a private subnet: {shared}"


def test_the_scan_finds_each_form():
    assert {248, 185} <= octets(SYSTEM / "test_vm.py")
    assert 63 in octets(SYSTEM / "test_launch.py")
    assert 200 in octets(SYSTEM / "test_follow_ssh.py")
    assert 91 in octets(SYSTEM / "test_sim.py")  # a sim cluster's table
    assert 61 in octets(SYSTEM / "test_netcheck_netns.py")  # an address string
    assert 117 in octets(SYSTEM / "test_interrupt.py")  # parametrized clusters
