"""`fatpipe data push` for a remote [data] source: every node fetches it over its own link, at once.

This machine writes the fetch spec (the source and its keys, never a credential) and, when one is
given, the CA bundle into .fatpipe/<cluster>/data/; `check.ship_checker` ships that folder
with the trainer package, and `python -m fatpipe.trainer.staging.fetch` runs on every node in parallel,
its progress read line by line. The nodes' manifests must agree file by file: the one most nodes
hold becomes this machine's copy, which `data verify` and `launch` check every node against.
docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import json
import shlex
import sys
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_atomic, write_json_atomic
from fatpipe.infra.node import REMOTE_PKG, REMOTE_VENV
from fatpipe.trainer.staging.fetch import ERROR_PREFIX, PROGRESS_PREFIX, RESULT_PREFIX
from fatpipe.trainer.staging.names import UnsafeName, check_manifest

from ..reach.cluster import Cluster
from ..reach.transport import Transport, fan_out
from .check import (
    MANIFEST_DIR,
    local_manifest_path,
    node_workdir,
    save_local_manifest,
    ship_checker,
)

FETCH_MODULE = "fatpipe.trainer.staging.fetch"
FETCH_SPEC, CA_NAME = "fetch.json", "ca.pem"
PICK_PYTHON = f"if [ -x {REMOTE_VENV}/bin/python ]; then echo {REMOTE_VENV}/bin/python; else echo python3; fi"

NodeProgress = Callable[[str, int, int, int], None]  # (node, bytes held, bytes in all, bytes fetched)


def write_fetch_spec(cluster: Cluster, spec) -> Path:
    """The spec every node's fetch reads, and the CA bundle beside it; returns the spec's path."""
    folder = local_manifest_path(cluster).parent
    ca = spec.ca_bundle_path(cluster.project.root)
    if ca is not None:
        if not ca.is_file():
            raise FatpipeError(f"data ca_bundle {spec.ca_bundle}: no such file ({ca})", exit_code=2)
        write_atomic(folder / CA_NAME, ca.read_bytes())
    else:
        (folder / CA_NAME).unlink(missing_ok=True)
    fields = {"source": spec.source, "path": spec.path, "chunk_size": spec.chunk_size,
              "endpoint_url": spec.endpoint_url, "region": spec.region, "insecure_http": spec.insecure_http,
              "anonymous": spec.anonymous, "ca_bundle": CA_NAME if ca is not None else None}
    return write_json_atomic(folder / FETCH_SPEC, fields)


def run_fetch(t: Transport, node: str, workdir: str, python: str | None, spec_rel: str,
              progress: NodeProgress | None) -> dict:
    """Run the fetch on one node, passing on its progress; its manifest, or FatpipeError naming it.

    Without `python`: the node venv's once built (boto3 comes with [node] packages), else python3.
    An ssh node's project folder is fatpipe's (`--own`); one that shares this machine's files is
    the user's project (trainer/staging/record.py)."""
    pick = shlex.quote(python) if python else f'"$({PICK_PYTHON})"'
    command = (f"cd {shlex.quote(workdir)} && PYTHONPATH={REMOTE_PKG} {pick} -m {FETCH_MODULE} "
               f"{shlex.quote(spec_rel)} .{'' if t.shares_fs else ' --own'}")
    proc = t.popen(command)
    result, error, tail = None, None, deque(maxlen=3)
    try:
        for line in proc.stdout:
            if line.startswith(PROGRESS_PREFIX):
                if progress:
                    progress(node, *(int(x) for x in line[len(PROGRESS_PREFIX):].split()))
            elif line.startswith(RESULT_PREFIX):
                result = json.loads(line[len(RESULT_PREFIX):])
            elif line.startswith(ERROR_PREFIX):
                error = line[len(ERROR_PREFIX):].strip()
            elif line.strip():
                tail.append(line.strip())
        code = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted here: the node keeps its partial copies
            proc.kill()
            proc.wait()
    if error or result is None:
        why = error or (tail[-1] if tail else f"exit status {code}")
        raise FatpipeError(f"{node}: fetching the data failed: {why}")
    try:  # what a node reports is checked like any remote name before this machine keeps it
        return check_manifest(result, f"node {node}")
    except UnsafeName as e:
        raise FatpipeError(f"{node}: {e}") from None


def file_difference(reference: dict, mine: dict, others: int) -> str:
    """The first file where a node's manifest differs from the one most nodes hold."""
    held = {f["name"]: f for f in mine["files"]}
    for entry in reference["files"]:
        shown = f"{reference['path']}/{entry['name']}" if reference["kind"] == "folder" else reference["path"]
        got = held.get(entry["name"])
        if got is None:
            return f"{shown}: missing"
        if (got["size"], got["sha256"]) != (entry["size"], entry["sha256"]):
            return f"{shown}: its sha256 differs from {others} other node(s)"
    extra = sorted(set(held) - {f["name"] for f in reference["files"]})
    return f"{reference['path']}/{extra[0]}: listed by it alone" if extra else "its manifest differs"


def agree(names: list[str], manifests: list[dict]) -> tuple[dict, list[str]]:
    """The manifest most nodes hold (node 0's on a tie), and one line per node that differs."""
    prints = [m["fingerprint"] for m in manifests]
    best = max(Counter(prints).items(), key=lambda kv: (kv[1], -prints.index(kv[0])))
    reference = {k: v for k, v in manifests[prints.index(best[0])].items() if k not in ("fetched_bytes", "removed")}
    odd = [f"node {name}: {file_difference(reference, m, best[1])}"
           for name, m in zip(names, manifests, strict=True) if m["fingerprint"] != best[0]]
    return reference, odd


def fetch_data(cluster: Cluster, spec, remote_python: str | None = None,
               progress: NodeProgress | None = None) -> tuple[dict, dict[str, int], dict[str, list[str]]]:
    """Every node fetches the remote source; (the agreed manifest, bytes each node fetched, the files
    each node removed because the source no longer lists them)."""
    project, outputs = cluster.project, cluster.outputs
    spec_path = write_fetch_spec(cluster, spec)
    transports = cluster.transports()
    names = [node.name for node in outputs.nodes]
    if all(t.shares_fs for t in transports):  # one copy serves them all
        rel = spec_path.relative_to(project.root).as_posix()
        one = run_fetch(transports[0], names[0], str(project.root), remote_python or sys.executable, rel, progress)
        manifests = [one] + [{**one, "fetched_bytes": 0, "removed": []}] * (len(names) - 1)
    elif any(t.shares_fs for t in transports):
        raise FatpipeError(f"cluster {outputs.name} mixes ssh nodes with local ones; data staging needs one kind")
    else:
        def on_node(pair) -> dict:
            node, t = pair
            workdir = node_workdir(outputs, node)
            ship_checker(cluster, t, workdir)
            return run_fetch(t, node.name, workdir, remote_python, f"{MANIFEST_DIR}/{FETCH_SPEC}", progress)
        manifests = fan_out(on_node, list(zip(outputs.nodes, transports, strict=True)))
    reference, odd = agree(names, manifests)
    save_local_manifest(cluster, reference)
    if odd:
        raise FatpipeError(f"the nodes fetched different data: {'; '.join(odd)} (did the source change during "
                           f"the push? `fatpipe data push {outputs.name}` fetches it again)")
    removed = {name: m["removed"] for name, m in zip(names, manifests, strict=True) if m.get("removed")}
    return reference, {name: m.get("fetched_bytes", 0) for name, m in zip(names, manifests, strict=True)}, removed
