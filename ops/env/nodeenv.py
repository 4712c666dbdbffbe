"""Before a launch, every node reports its Python, torch, CUDA/NCCL, numpy and torchft; all must agree.

docs/ARCHITECTURE.md, "The node environment": one fixed `python -c` per node (node/versions.py,
which reads the versions without importing torch), a step of the launch's one call to each node,
all nodes in parallel; the report lands in the run folder (`env.json`), and a node that
differs from the others fails the launch in one line naming it and the difference, as does a
node without torchft under fault_tolerance = "live".
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_atomic
from fatpipe.node import source_file
from fatpipe.node.versions import MARK

from ..rdzv.noderun import NodeRun
from ..reach.asknode import NodeCallError, Step, answer_of, keep, step_value
from ..reach.transport import Result, fan_out

ENV_FILE = "env.json"
COMPARED = ("python", "torch", "cuda", "nccl", "numpy", "torchft")  # in the order a difference is named
PROBE_TIMEOUT_S = 120  # an interpreter's start on a loaded node; nothing heavy is imported
PROBE = source_file("versions").read_text()


def probe_step(node: NodeRun) -> Step:
    """The node program's step that reports the versions in the run's interpreter, from the project folder."""
    return Step("run_python", (node.plan.python, PROBE, PROBE_TIMEOUT_S), node.plan.workdir)


def probe_node(node: NodeRun) -> dict:
    """The node's versions, as its run's interpreter sees them from the project folder."""
    try:
        answer = answer_of(node.transport, probe_step(node), timeout=PROBE_TIMEOUT_S + 30)
    except NodeCallError as e:
        raise FatpipeError(f"node {node.name}: cannot report its Python environment: {e.reason}") from None
    ran = step_value(answer, "cannot report its Python environment", node.transport)
    lines = [line for line in ran["out"].splitlines() if line.startswith(MARK)]
    if ran["rc"] or not lines:
        reason = Result(ran["rc"], ran["out"], ran["err"]).reason()
        raise FatpipeError(f"node {node.name}: cannot report its Python environment: {reason}")
    # The command's next launch (`up`: netcheck's, then the training's) takes it while nothing is
    # built or copied on the node in between (ops.env.venvs and ops.run.prepare drop it then).
    keep(node.transport, probe_step(node), answer)
    return json.loads(lines[-1][len(MARK):])


def shown(value) -> str:
    return "none" if value is None else str(value)


def differences(reports: dict[str, dict]) -> list[str]:
    """One phrase per node that differs from the others, e.g. `node x-1: torch 2.12.0, the others 2.13.0`.

    "The others" is the most common value (ties: the first node's), so one odd node among many is
    the one named.
    """
    names = list(reports)
    found = []
    for key in COMPARED:
        values = [reports[name].get(key) for name in names]
        counts = Counter(values)
        usual = max(counts, key=lambda v: (counts[v], v == values[0]))
        for name, value in zip(names, values, strict=True):
            if value != usual:
                found.append(f"node {name}: {key} {shown(value)}, the others {shown(usual)}")
    return found


def summary_line(reports: dict[str, dict]) -> str:
    """The launch's one line about the nodes' environment."""
    first = next(iter(reports.values()))
    return (f"node environment ({len(reports)} node(s) alike): Python {shown(first.get('python'))}, "
            f"torch {shown(first.get('torch'))}, CUDA {shown(first.get('cuda'))}, "
            f"NCCL {shown(first.get('nccl'))}, numpy {shown(first.get('numpy'))}, "
            f"torchft {shown(first.get('torchft'))}")


def check_node_envs(nodes: list[NodeRun], run_dir: Path, live: bool = False) -> str:
    """Probe every node, save `env.json` in the run folder, refuse a launch on unequal nodes
    (and a `live` one on nodes without torchft).

    Returns the one line to show; raises FatpipeError naming each node that differs.
    """
    reports = dict(zip([n.name for n in nodes], fan_out(probe_node, nodes), strict=True))
    found = differences(reports)
    write_atomic(Path(run_dir) / ENV_FILE, json.dumps({"nodes": reports, "same": not found}, indent=1) + "\n")
    if found:
        raise FatpipeError("the nodes' Python environments differ: " + "; ".join(found))
    broken = [f"node {name}: {r['error']}" for name, r in reports.items() if r.get("error")]
    if live and not broken:
        broken = [f"node {name}: no torchft for Python {r.get('python')} on {r.get('machine')} (its "
                  "wheels: CPython 3.10-3.12, x86_64); set [train] fault_tolerance = \"restart\""
                  for name, r in reports.items() if not r.get("torchft")]
    if broken:
        raise FatpipeError("; ".join(broken))
    return summary_line(reports)
