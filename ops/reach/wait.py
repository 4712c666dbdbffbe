"""Is every node ready? Reachable, its boot finished (the ready marker), its sysctls read back as declared."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fatpipe.infra.node import (
    READY_FILE as CLOUD_READY_FILE,  # written last by cloud-init on cloud nodes
)
from fatpipe.infra.tiers import sysctl_mismatches, tier_name, tier_profile

from .asknode import NodeCallError, Step, answer_of, ask
from .cluster import Cluster
from .firewall_check import LISTING, check_readiness
from .projectdir import NODE_CHECKS
from .transport import Transport, fan_out

MARK = "@@fatpipe"
# Root qdiscs the kernel attaches by itself; the node profile replaces these with fq, and leaves
# any other (a tbf or htb someone installed to shape the link) alone.
DEFAULT_QDISCS = ("pfifo_fast", "pfifo", "fq_codel", "mq", "noqueue", "fq")
INGRESS_QDISCS = ("ingress", "clsact")


@dataclass
class NodeReadiness:
    """One node's answer; `reason` says what is missing when it is not ready."""

    name: str
    transport: str
    reachable: bool = False
    booted: bool = False
    sysctls_ok: bool = False
    checked: int = 0  # how many sysctls were compared
    iface: str = ""
    mtu: int | None = None
    firewall_ok: bool = True  # machines fatpipe did not make: their host firewall is in place
    listing: dict | None = field(default=None, repr=False)  # the firewall's, read with the probe
    reason: str = "not checked yet"
    marker: dict = field(default_factory=dict, repr=False)

    @property
    def ready(self) -> bool:
        return self.reachable and self.booted and self.sysctls_ok and self.firewall_ok


def probe_command(ready_file: str, names: list[str]) -> str:
    """The probe as a shell command (what callsteps.readiness answers, in the same lines): the
    marker, then every declared sysctl read from /proc/sys on the node."""
    reads = " ".join(
        f"printf '{MARK} sysctl %s %s\\n' {shlex.quote(n)} \"$(cat /proc/sys/{n.replace('.', '/')} 2>/dev/null)\";"
        for n in names
    )
    # A machine's own marker may sit below $FATPIPE_ROOT (a sim node that shares its host's files).
    path = shlex.quote(ready_file)
    if ready_file == CLOUD_READY_FILE:
        path = f'"${{FATPIPE_ROOT:-}}"{path}'
    return (
        f"echo {MARK} reachable; if [ -r {path} ]; then echo {MARK} marker; "
        f"cat {path}; echo; else echo {MARK} no-marker; fi; {reads} true"
    )


def parse_probe(stdout: str) -> tuple[bool, dict | None, dict[str, str]]:
    """(reachable, marker or None, {sysctl: value}) from `probe_command`'s output."""
    reachable, marker_lines, in_marker, values = False, [], False, {}
    marker_seen = False
    for line in stdout.splitlines():
        if line.startswith(MARK):
            in_marker = False
            _, kind, *rest = line.split(" ", 2)
            if kind == "reachable":
                reachable = True
            elif kind == "marker":
                in_marker, marker_seen = True, True
            elif kind == "sysctl" and rest:
                name, _, value = rest[0].partition(" ")
                if value.strip():
                    values[name] = " ".join(value.split())
        elif in_marker:
            marker_lines.append(line)
    marker = None
    if marker_seen:
        try:
            marker = json.loads("\n".join(marker_lines) or "{}")
        except ValueError:
            marker = {"_unreadable": True}
    return reachable, marker, values


def readiness_step(node, declared: dict[str, str]) -> Step:
    """The node program's step that reads what `probe_command` prints (callsteps.readiness)."""
    ready_file = node.ready_file or CLOUD_READY_FILE
    # A machine's own marker may sit below the node's $FATPIPE_ROOT (a sim node that shares its
    # host's files): read there, on the node.
    return Step("callsteps.readiness", (ready_file, ready_file == CLOUD_READY_FILE, tuple(sorted(declared)), MARK),
                sources=NODE_CHECKS)


def check_node(transport: Transport, node, declared: dict[str, str], timeout: float = 30,
               firewall: bool = False) -> NodeReadiness:
    """Probe one node once, in one round trip (with its firewall's listing when `firewall`)."""
    state = NodeReadiness(node.name, node.transport)
    ready_file = node.ready_file or CLOUD_READY_FILE
    steps = [readiness_step(node, declared), *([LISTING] if firewall else [])]
    try:
        answers = [answer_of(transport, steps[0], timeout)] if not firewall else ask(transport, steps, timeout)
    except NodeCallError as e:
        state.reason = f"unreachable: {e.reason}"
        return state
    if firewall:
        state.listing = answers[1]
    reachable, marker, values = parse_probe(answers[0].get("ok") or "")
    state.reachable = reachable
    if not reachable:
        state.reason = f"unreachable: {answers[0].get('error')}"
        return state
    if marker is None:
        state.reason = f"booting: no ready marker {ready_file} yet (cloud-init not finished)"
        return state
    if marker.get("_unreadable"):
        state.reason = f"booting: ready marker {ready_file} is not JSON yet"
        return state
    state.booted, state.marker = True, marker
    state.iface, state.mtu = str(marker.get("iface", "")), marker.get("mtu")
    # A sim node can only set what its namespace holds; the rest is the host's business.
    if "namespaced" in marker and node.transport != "ssh":
        declared = {k: v for k, v in declared.items() if k in set(marker["namespaced"])}
    # Applied over SSH: what the kernel refused or does not have here (a namespace, a container
    # VPS) is reported with the node's state, not waited for.
    applied = marker.get("sysctl_apply") or {}
    untaken = sorted({*applied.get("refused", {}), *applied.get("absent", [])} & set(declared))
    declared = {k: v for k, v in declared.items() if k not in untaken}
    state.checked = len(declared)
    problems = [f"sysctl {p}" for p in sysctl_mismatches(declared, values)] + profile_problems(marker)
    if problems:
        state.reason = problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        return state
    state.sysctls_ok, state.reason = True, "ready"
    if untaken:
        state.reason = f"ready; the kernel did not take {', '.join(untaken)}"
    return state


def profile_problems(marker: dict) -> list[str]:
    """What the node profile's ready marker says went wrong at boot (cloud and ssh nodes)."""
    problems = []
    missing = sorted(name for name, ok in (marker.get("packages") or {}).items() if not ok)
    if missing:
        problems.append(f"packages not installed: {', '.join(missing)} (apt failed at boot? see "
                        "/var/log/cloud-init-output.log)")
    qdisc = marker.get("qdisc")
    if isinstance(qdisc, list):  # an ingress qdisc (a policer, a vm's rtt_ms) paces no sending
        qdisc = [name for name in qdisc if name not in INGRESS_QDISCS]
    shaped = isinstance(qdisc, list) and qdisc[:1] and qdisc[0] not in DEFAULT_QDISCS  # someone's shaper
    if isinstance(qdisc, list) and not shaped and (not qdisc or "fq" not in qdisc or set(qdisc) - {"fq", "mq"}):
        problems.append(f"qdisc {' '.join(qdisc) or 'none'} on {marker.get('iface')} (want fq, or mq of fq)")
    return problems


def declared_sysctls(outputs) -> dict[str, str]:
    return tier_profile(tier_name(outputs.tier_gbps), outputs.max_rtt_ms).sysctls


def wait_for_nodes(cluster: Cluster, timeout_s: float = 300, interval_s: float = 2,
                   on_update: Callable[[list[NodeReadiness]], None] | None = None) -> list[NodeReadiness]:
    """Probe every node until all are ready or `timeout_s` passes; returns the last answers.

    Nodes already ready are not probed again; each round probes the rest in parallel.
    """
    outputs, transports = cluster.outputs, cluster.transports()
    declared = declared_sysctls(outputs)
    states = [NodeReadiness(n.name, n.transport) for n in outputs.nodes]
    deadline = time.monotonic() + timeout_s
    while True:
        todo = [i for i, s in enumerate(states) if not s.ready]
        probe_timeout = min(30.0, max(1.0, deadline - time.monotonic()))
        fresh = fan_out(
            lambda i, t=probe_timeout: check_readiness(
                check_node(transports[i], outputs.nodes[i], declared, timeout=t, firewall=bool(outputs.firewall)),
                transports[i], outputs.nodes[i], outputs, timeout=t), todo
        )
        for i, state in zip(todo, fresh, strict=True):
            states[i] = state
        if on_update:
            on_update(states)
        if all(s.ready for s in states) or time.monotonic() + interval_s > deadline:
            return states
        time.sleep(interval_s)
