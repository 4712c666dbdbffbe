"""The wait step `wait` and `up` share: wait for the deployed nodes with a live summary line, then
name those not ready. Apart from the link check (cli/netstep.py) and the run steps (cli/steps.py)
so `wait` imports neither.
"""

from __future__ import annotations

from fatpipe.infra.errors import FatpipeError
from fatpipe.ops.reach.hostkeys import pin_cluster_keys
from fatpipe.ops.reach.wait import wait_for_nodes
from fatpipe.stacks.providers import provider_for
from fatpipe.stacks.providers.sim import vanished_nodes


def wait_ready(cluster, timeout_s: float, out):
    """Wait with a live summary line for the deployed `cluster`; returns the final per-node states.

    Sim nodes that are gone from this machine (a restart clears namespaces) are named at once,
    with the fix, instead of being waited for.
    """
    outputs = cluster.outputs
    gone = vanished_nodes(outputs)
    if gone:
        raise FatpipeError(f"{', '.join(gone)}: gone from this machine, though {outputs.name} is deployed "
                           f"(a restart clears network namespaces): `fatpipe deploy {outputs.name}` "
                           "makes them again")

    with out.status(f"waiting for {len(outputs.nodes)} node(s)") as status:
        pin_cluster_keys(cluster, provider_for(outputs.provider).console_output, timeout_s)
        def update(states):
            ready = sum(s.ready for s in states)
            pending = next((f"{s.name}: {s.reason}" for s in states if not s.ready), "")
            status.update(f"{ready}/{len(states)} node(s) ready {pending}")

        return wait_for_nodes(cluster, timeout_s=timeout_s, on_update=update)


def require_ready(states, timeout_s: float) -> None:
    """Raise naming every node that is not ready, with its reason."""
    late = [s for s in states if not s.ready]
    if late:
        reasons = "\n  ".join(f"{s.name}: {s.reason}" for s in late)
        raise FatpipeError(f"{len(late)} node(s) not ready after {timeout_s:g} s:\n  {reasons}")
