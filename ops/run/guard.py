"""Whether a run is going on a cluster, asked before a command that would collide with it or change
its nodes under it (`launch`, `up`, `netcheck`, `data push`, `deploy`).

A node that answers says whether its run goes on. A node out of reach may be running it (a cut
ssh is no end: docs/ARCHITECTURE.md, "A run lives on its nodes"), so it counts as "maybe" while it
is still deployed as the run knew it: the command is refused, naming the node, unless `force`. A
node no longer deployed (the cluster destroyed, the node made again elsewhere, its namespace gone)
holds no run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from ..rdzv.noderun import NodeRun, node_states, run_nodes
from ..rdzv.rendezvous import read_rendezvous
from ..reach.cluster import Cluster

NETNS_DIR = Path("/run/netns")  # where iproute2 keeps the named namespaces (sim netns nodes)
ENDED = ("lost", "not-started")  # with a recorded exit status: the node's run is over


@dataclass(frozen=True)
class Going:
    """The cluster's latest run, where it may still be going."""

    run_id: str
    running: list[str] = field(default_factory=list)  # nodes that say it runs there
    unreachable: dict[str, str] = field(default_factory=dict)  # {node: why}: out of reach, may run it


def run_going(cluster: Cluster, nodes: list[NodeRun] | None = None) -> Going | None:
    """The latest run of `cluster` (its `nodes`, when read already) where it runs or may run, or
    None. The cluster's outputs: as deployed now (none given: its outputs file; none: not deployed)."""
    if nodes is None:
        try:
            nodes = run_nodes(cluster)[2]
        except FatpipeError:
            return None
    if not nodes:
        return None
    states = node_states(nodes)
    running = [n.name for n, state in zip(nodes, states, strict=True) if state == "running"]
    unknown = [(n, state) for n, state in zip(nodes, states, strict=True)
               if state != "running" and not holds_no_run(state)]
    if unknown:
        deployed = cluster.outputs if cluster.outputs is not None else _deployed(cluster)
        unknown = [(n, state) for n, state in unknown if still_deployed(n, deployed)]
    if not running and not unknown:
        return None
    return Going(nodes[0].rdzv.run_id, running,
                 {n.name: state.removeprefix("unreachable: ") for n, state in unknown})


def holds_no_run(state: str) -> bool:
    """The node answered, and its run is over or never began there: an exit status, lost or not
    started, or a node whose run folder does not exist (a rendezvous never launched there)."""
    return (state in ENDED or state.lstrip("-").isdigit()
            or (state.startswith("unreadable:") and "FileNotFoundError" in state))


def _deployed(cluster: Cluster):
    try:
        return cluster.load_outputs()
    except FatpipeError:  # not deployed (destroyed): none of the run's nodes is there
        return None


def still_deployed(node: NodeRun, outputs) -> bool:
    """Whether the machine `node` ran on is still the cluster's: deployed under its name at the
    same address (a netns node: its namespace still there)."""
    now = next((n for n in outputs.nodes if n.name == node.name), None) if outputs is not None else None
    plan = node.plan
    if now is None or now.transport != plan.transport:
        return False
    if plan.transport == "netns":
        return now.netns == plan.netns and (NETNS_DIR / (plan.netns or "")).exists()
    if plan.transport == "local":
        return True
    return ((now.ssh_host or now.public_ip), now.ssh_port) == ((plan.ssh_host or plan.public_ip), plan.ssh_port)


def refuse_if_running(cluster: Cluster, nodes: list[NodeRun] | None = None, live_ok: bool = False,
                      force: bool = False) -> str | None:
    """Refuse while a run is going on the cluster, or may be (a node out of reach: `force` goes
    on); with `live_ok`, a live run is let go on (it rides out a node made again). The line to
    show when the command goes on beside a run, else None."""
    going = run_going(cluster, nodes)
    if going is None:
        return None
    name, run_id, names, away = cluster.name, going.run_id, going.running, going.unreachable
    if live_ok and read_rendezvous(cluster.find_run(run_id)[1]).live:
        where = ", ".join(names + [f"{n} (out of reach)" for n in away])
        return (f"run {run_id} goes on live on {where}: a node made again here joins it "
                f"with `fatpipe launch {name} --rejoin NODE`")
    if names:
        raise FatpipeError(f"run {run_id} is still running on {', '.join(names)}: follow it with "
                           f"`fatpipe logs {name} -f` or end it with `fatpipe stop {name}`")
    maybe = (f"{', '.join(away)} could not be reached ({next(iter(away.values()))}): run {run_id} may "
             "still be going there")
    if force:
        return f"warning: {maybe}; going on (--force)"
    raise FatpipeError(f"{maybe}; `fatpipe logs {name} -f` follows it, `fatpipe stop {name}` "
                       "ends it, --force goes on without knowing")
