"""Both backends of the host firewall (nftables, and iptables where `nft` is missing) in a real
network namespace: a second namespace holds a node's address, a neighbour's inside the trusted
network and one outside; from the outside only the SSH port answers; the neighbour reaches
neither the run's ports nor the ephemeral range (torchft's Manager and checkpoint server, gloo)
but the rest; revert hands the ruleset back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import PORT_LISTENER as LISTENER

TAG = f"fwb{os.getpid() % 100000}"
NODE, PEER = f"{TAG}-node", f"{TAG}-peer"
TRUSTED = "10.152.0.0/24"
NODE_IN, PEER_IN, NODE_OUT, PEER_OUT = "10.152.0.1", "10.152.0.2", "198.51.100.5", "198.51.100.6"
NEIGHBOUR = "10.152.0.3"  # inside the trusted network, not a node of the cluster
RDZV, SSH = 29400, 22
LIGHTHOUSE = RDZV + 4  # node 1's Lighthouse (ops.rdzv.nodefiles.live_port): inside the run's ports
MANAGER = 45123  # torchft's Manager and checkpoint server, gloo: a port of the ephemeral range
OTHER = 8080  # a port no run uses: the declared network still reaches it
NODE_SIDE = """\
import json, sys
from fatpipe.node import hostfirewall as fw
if sys.argv[1] == "iptables":  # as on a machine without nft
    real = fw.which
    fw.which = lambda name: None if name == "nft" else real(name)
if sys.argv[2] == "apply":
    print(json.dumps({"before": fw.snapshot(), "tool": fw.apply(json.loads(sys.argv[3]), [int(sys.argv[4])])}))
else:
    print(json.dumps({"restored": fw.revert(json.loads(sys.argv[3]))}))
"""
CONNECT = """\
import socket, sys
s = socket.socket(); s.settimeout(3); s.bind((sys.argv[1], 0))
try:
    s.connect((sys.argv[2], int(sys.argv[3])))
except OSError:
    sys.exit(3)
"""


def ns_run(ns: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=60)


def connects(source: str, port: int) -> bool:
    done = ns_run(PEER, sys.executable, "-c", CONNECT, source, NODE_IN, str(port))
    assert done.returncode in (0, 3), done.stderr
    return done.returncode == 0


@pytest.fixture
def wired(needs_netns):
    """The node and its peer on one veth: the peer has a trusted address and an outside one."""
    steps = [["ip", "netns", "add", NODE], ["ip", "netns", "add", PEER],
             ["ip", "link", "add", f"{TAG}a", "type", "veth", "peer", "name", f"{TAG}b"],
             ["ip", "link", "set", f"{TAG}a", "netns", NODE], ["ip", "link", "set", f"{TAG}b", "netns", PEER]]
    for ns, dev, addrs in ((NODE, f"{TAG}a", (NODE_IN, NODE_OUT)), (PEER, f"{TAG}b", (PEER_IN, PEER_OUT))):
        steps += [["ip", "-n", ns, "addr", "add", f"{addrs[0]}/24", "dev", dev],
                  ["ip", "-n", ns, "addr", "add", f"{addrs[1]}/30", "dev", dev],
                  ["ip", "-n", ns, "link", "set", dev, "up"], ["ip", "-n", ns, "link", "set", "lo", "up"]]
    steps.append(["ip", "-n", PEER, "addr", "add", f"{NEIGHBOUR}/24", "dev", f"{TAG}b"])
    listener = None
    try:
        for argv in steps:
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        listener = subprocess.Popen(["ip", "netns", "exec", NODE, sys.executable, "-c", LISTENER,
                                     *map(str, (RDZV, SSH, LIGHTHOUSE, MANAGER, OTHER))], stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "listening"
        yield
    finally:
        if listener:
            listener.kill()
            listener.wait()
        for ns in (NODE, PEER):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.parametrize("backend", ["nft", "iptables"])
def test_outside_reaches_only_ssh_and_revert_hands_the_ruleset_back(wired, backend):
    assert connects(PEER_OUT, RDZV) and connects(NEIGHBOUR, MANAGER)  # open before
    # As infra.firewall.firewall_plan makes it for two nodes that declare private_cidr.
    plan = json.dumps({"trusted": [TRUSTED], "members": [f"{NODE_IN}/32", f"{PEER_IN}/32"], "run_ports": [RDZV, RDZV + 5]})
    applied = ns_run(NODE, sys.executable, "-c", NODE_SIDE, backend, "apply", plan, str(SSH))
    assert applied.returncode == 0, applied.stderr
    done = json.loads(applied.stdout)
    assert done["tool"] == backend and done["before"]["tool"] == backend

    assert not connects(PEER_OUT, RDZV) and connects(PEER_OUT, SSH)
    assert connects(PEER_IN, RDZV) and connects(PEER_IN, SSH)
    # The store, a Lighthouse, the Manager and checkpoint server: the node alone; the rest of the
    # network reaches the other ports.
    for port in (RDZV, LIGHTHOUSE, MANAGER):
        assert connects(PEER_IN, port) and not connects(NEIGHBOUR, port), port
    assert connects(NEIGHBOUR, OTHER) and connects(NEIGHBOUR, SSH)
    again = ns_run(NODE, sys.executable, "-c", NODE_SIDE, backend, "apply", plan, str(SSH))
    assert again.returncode == 0 and not connects(PEER_OUT, RDZV)  # re-applied: replaced, not stacked

    reverted = ns_run(NODE, sys.executable, "-c", NODE_SIDE, backend, "revert", json.dumps(done["before"]))
    assert reverted.returncode == 0, reverted.stderr
    assert json.loads(reverted.stdout) == {"restored": True}
    assert connects(PEER_OUT, RDZV)
    if backend == "nft":
        assert ns_run(NODE, "nft", "list", "ruleset").stdout == done["before"]["ruleset"]
