"""Is the cluster already deployed as declared, and ready? What `fatpipe up` may skip."""

from __future__ import annotations

import json
from pathlib import Path

from fatpipe.infra.defaults import NETCHECK_FILE
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.outputs import ClusterOutputs, read_outputs
from fatpipe.infra.runs import json_problem

from .cluster import Cluster
from .wait import wait_for_nodes

# How long deployed nodes get to answer before `up` deploys again: ready nodes answer at once,
# but an SSH round trip and the node check take seconds on a loaded machine or a far node.
READY_CHECK_S = 20


def deployment_mismatch(outputs: ClusterOutputs, spec) -> str | None:
    """Why the existing outputs do not describe the cluster file's cluster, or None if they do."""
    checks = [
        ("provider", outputs.provider, spec.provider),
        ("nodes", len(outputs.nodes), spec.nodes),
        ("tier_gbps", outputs.tier_gbps, spec.tier_gbps),
        ("rdzv_port", outputs.rdzv_port, spec.rdzv_port),
        ("private_cidr", outputs.private_cidr, spec.node_network),
    ]
    for key, have, want in checks + spec.deployment_keys(outputs):  # and what its provider adds
        if have != want:
            return f"{key} is {have} in the outputs but {want} in the cluster file"
    return None


def ready_deployment(cluster: Cluster, outputs_path: Path) -> tuple[ClusterOutputs | None, str]:
    """(the outputs, "") when the cluster is deployed as declared and every node is ready;
    else (None, why not)."""
    spec = cluster.spec
    if not outputs_path.exists():
        return None, "not deployed"
    try:
        outputs = read_outputs(outputs_path, spec.name)
    except FatpipeError as e:
        return None, f"existing outputs unusable ({e})"
    mismatch = deployment_mismatch(outputs, spec)
    if mismatch:
        return None, f"the deployment differs from the cluster file ({mismatch})"
    states = wait_for_nodes(cluster.deployed(outputs), timeout_s=READY_CHECK_S, interval_s=1)
    late = [s for s in states if not s.ready]
    if late:
        return None, f"{late[0].name} is not ready ({late[0].reason})"
    return outputs, ""


def reusable_netcheck(cluster: Cluster, outputs_mtime: float) -> Path | None:
    """The newest netcheck.json that passed on the current deployment (written after its outputs);
    one of this deployment's that cannot be read is refused (`check_netchecks`)."""
    check_netchecks(cluster, outputs_mtime)
    base = cluster.runs_dir
    for path in sorted(base.glob(f"*/{NETCHECK_FILE}"), key=lambda p: p.parent.name, reverse=True):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        gate = doc.get("gate") if isinstance(doc, dict) else None
        passed = gate.get("passed") if isinstance(gate, dict) else False  # a corrupt file: not reused
        if passed is True and path.stat().st_mtime > outputs_mtime:
            return path
    return None


def check_netchecks(cluster: Cluster, since: float) -> None:
    """Refuse, exit 2, naming the file, when a netcheck.json that could be reused (written on this
    deployment) is unreadable: reusing it is what `up` is asked to do, so it must not guess."""
    for path in sorted(cluster.runs_dir.glob(f"*/{NETCHECK_FILE}")):
        if path.stat().st_mtime <= since:
            continue
        why = json_problem(path)
        if why is None and not isinstance(json.loads(path.read_text()).get("gate", {}), dict):
            why = "its gate is not an object"
        if why is not None:
            raise FatpipeError(f"{path}: unreadable ({why}); remove it (`rm {path}`) and run again: up then "
                               "measures the links anew", exit_code=2)
