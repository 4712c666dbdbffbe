"""Is the host firewall in place on every node that should have one? (docs/ARCHITECTURE.md,
"The node firewall"). `wait` asks it of each node; a launch refuses a node where it is not.
"""

from __future__ import annotations

import re

from fatpipe.infra.errors import FatpipeError
from fatpipe.node.hostfirewall import CHAIN, SBIN, TABLE

from .asknode import NodeCallError, Step, answer_of
from .cluster import Cluster
from .projectdir import NODE_CHECKS, undo_fresh_claims
from .transport import Result, Transport, fan_out

# Root lists the ruleset; another login through sudo -n (it has passwordless sudo: deploy needs
# it): callsteps.firewall_listing, a step of the command's one call to the node.
LISTING = Step("callsteps.firewall_listing", (SBIN, TABLE, CHAIN), sources=NODE_CHECKS)


def listing_problem(listing: str, ssh_port: int) -> str | None:
    """What is missing from the nft table or the iptables chains as listed; None when in place."""
    if f"table inet {TABLE}" in listing:
        wanted = {"hook input": "hook input", "policy drop;": "policy drop", "ip saddr": "trusted network"}
        missing = [what for text, what in wanted.items() if text not in listing]
        ports = re.search(r"tcp dport (\{[^}]*\}|\d+) accept", listing)
        if not ports or str(ssh_port) not in re.findall(r"\d+", ports.group(1)):
            missing.append(f"SSH port {ssh_port}")
        return f"the firewall table inet {TABLE} lacks {', '.join(missing)}" if missing else None
    if f"-N {CHAIN}" in listing:
        lines = listing.splitlines()
        missing = [what for text, what in ((f"-A INPUT -j {CHAIN}", "its jump from INPUT"),
                                           (f"-A {CHAIN} -j DROP", "its final DROP")) if text not in lines]
        if not any(line.startswith(f"-A {CHAIN} -s ") for line in lines):
            missing.append("the trusted network")
        return f"the firewall chain {CHAIN} lacks {', '.join(missing)}" if missing else None
    return f"no firewall: neither table inet {TABLE} nor chain {CHAIN} is there"


def node_problem(transport: Transport, node, timeout: float = 30, answer: dict | None = None) -> str | None:
    """Probe one node (unless its listing's `answer` came already); what is wrong with its firewall, or None."""
    try:
        answer = answer or answer_of(transport, LISTING, timeout)
    except NodeCallError as e:
        return f"its firewall cannot be read: {e.reason}"
    if "error" in answer:
        return f"its firewall cannot be read: {answer['error']}"
    listed = answer["ok"]
    result = Result(listed["rc"], listed["out"], listed["err"])
    if not result.ok and not result.stdout:
        text = f"{result.stderr}"
        if "a password is required" in text or "a terminal is required" in text:
            return "its firewall cannot be read: the login has no passwordless sudo"
        if f"inet {TABLE}" in text or CHAIN in text or "No such file" in text:
            return f"no firewall: neither table inet {TABLE} nor chain {CHAIN} is there"
        return f"its firewall cannot be read: {result.reason()}"
    return listing_problem(result.stdout, node.ssh_port or 22)


def check_readiness(state, transport: Transport, node, outputs, timeout: float = 30):
    """`wait`: a node otherwise ready is not, while its firewall is missing (outputs.firewall)."""
    if outputs.firewall and state.ready:
        problem = node_problem(transport, node, timeout, state.listing)
        if problem:
            state.firewall_ok, state.reason = False, problem
    return state


def require_firewall(cluster: Cluster) -> list[str]:
    """Before a run opens the rendezvous port: raise naming the first node without its firewall;
    return the warnings to print (a cluster that opted out)."""
    outputs = cluster.outputs
    if outputs.firewall is None:
        return []
    if not outputs.firewall:
        return [f"cluster {outputs.name} has firewall = false: the rendezvous port {outputs.rdzv_port} and "
                "the training ports are open to whoever reaches its nodes"]
    transports = cluster.transports()
    problems = fan_out(lambda i: node_problem(transports[i], outputs.nodes[i]), range(len(outputs.nodes)))
    if any(problems):  # what the command's first call made on the nodes goes again
        fan_out(undo_fresh_claims, transports)
    for node, problem in zip(outputs.nodes, problems, strict=True):
        if problem:
            raise FatpipeError(f"node {node.name}: {problem}; the run is refused (`fatpipe deploy "
                               f"{outputs.name}` puts it back; firewall = false opts out)")
    return []
