"""Before a launch, every node reports its Python, torch, CUDA/NCCL and numpy; all must agree.

docs/ARCHITECTURE.md, "The node environment": one fixed `python -c` per node, through its
transport and in parallel; the report lands in the run folder (`env.json`), and a node that
differs from the others fails the launch in one line naming it and the difference.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_atomic

from ..rdzv.noderun import NodeRun
from ..reach.transport import fan_out

ENV_FILE = "env.json"
COMPARED = ("python", "torch", "cuda", "nccl", "numpy")  # in the order a difference is named
MARK = "FATPIPE_ENV "
PROBE_TIMEOUT_S = 300  # a loaded machine imports torch slowly, several nodes at once
# Fixed text: nothing of the node or the config enters it. torch.cuda.nccl.version() exists only
# in CUDA builds.
PROBE = f"""
import json, platform
r = {{"python": platform.python_version(), "machine": platform.machine()}}
try:
    import torch
    r["torch"], r["cuda"] = torch.__version__, torch.version.cuda
    try:
        r["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        r["nccl"] = None
except Exception as e:
    r["torch"] = r["cuda"] = r["nccl"] = None
    r["error"] = f"import torch: {{type(e).__name__}}: {{e}}"
try:
    import numpy
    r["numpy"] = numpy.__version__
except Exception:
    r["numpy"] = None
print({MARK!r} + json.dumps(r))
"""


def probe_node(node: NodeRun) -> dict:
    """The node's versions, as its run's interpreter sees them from the project folder."""
    command = node.sh(f"{shlex.quote(node.plan.python)} -c {shlex.quote(PROBE)}")
    result = node.transport.run(command, timeout=PROBE_TIMEOUT_S)
    lines = [line for line in result.stdout.splitlines() if line.startswith(MARK)]
    if not result.ok or not lines:
        raise FatpipeError(f"node {node.name}: cannot report its Python environment: {result.reason()}")
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
            f"NCCL {shown(first.get('nccl'))}, numpy {shown(first.get('numpy'))}")


def check_node_envs(nodes: list[NodeRun], run_dir: Path) -> str:
    """Probe every node, save `env.json` in the run folder, refuse a launch on unequal nodes.

    Returns the one line to show; raises FatpipeError naming each node that differs.
    """
    reports = dict(zip([n.name for n in nodes], fan_out(probe_node, nodes), strict=True))
    found = differences(reports)
    write_atomic(Path(run_dir) / ENV_FILE, json.dumps({"nodes": reports, "same": not found}, indent=1) + "\n")
    if found:
        raise FatpipeError("the nodes' Python environments differ: " + "; ".join(found))
    broken = [f"node {name}: {r['error']}" for name, r in reports.items() if r.get("error")]
    if broken:
        raise FatpipeError("; ".join(broken))
    return summary_line(reports)
