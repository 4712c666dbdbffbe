"""Check every node's copy of the cluster's dataset against the operator's manifest.

Each ssh node gets one command: its folder claimed, the manifest written and what it holds hashed
by the check's standard-library modules sent with it (`nodeprogram`); nodes that share this
machine's files are checked once, here. docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.dataspec import LOCAL_MANIFEST, DataSpec
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_json_atomic
from fatpipe.trainer.staging.check import IN_THE_WAY_PREFIX, PRUNED_PREFIX, verdict
from fatpipe.trainer.staging.hashcache import HashCache
from fatpipe.trainer.staging.names import UnsafeName, check_manifest
from fatpipe.trainer.staging.record import InTheWay

from ..env.shipped import SYNC_EXCLUDES, shipped_packages
from ..rdzv.rendezvous import remote_dir
from ..reach.cluster import Cluster
from ..reach.projectdir import claim_project_dir, judge_claim
from ..reach.transport import Transport, fan_out
from .nodeprogram import boot_command, claimed, program_line

MANIFEST_DIR = ".fatpipe/data"  # on a node, inside its project folder: the manifest it is checked against
CHECK_TIMEOUT_S = 3600  # hashing a large dataset on a slow disk
LOCAL_HASHES = "data-hashes.json"  # the operator's hash cache, beside its manifest; stays here


@dataclass(frozen=True)
class NodeData:
    """One node's verdict: None when its data matches the manifest, else the first difference (and
    the files it holds beyond the manifest); `removed`: what a push's check removed as not listed."""

    node: str
    problem: str | None
    removed: tuple[str, ...] = ()


def declared_data(cluster: Cluster) -> DataSpec:
    data = cluster.data
    if data is None:
        raise FatpipeError(f"{cluster.project.label}: no [data] for cluster {cluster.name}; declare one "
                           "([data] source = \"data/train\", or [clusters.<name>.data])", exit_code=2)
    return data


def data_excludes(data: DataSpec | None) -> tuple[str, ...]:
    """rsync patterns, anchored at the project folder, for the staged data (the cluster's
    `data`) and what travels with it."""
    if data is None:
        return ()
    return (f"/{data.path}", f"/{data.path}.fatpipe-*", f"/{MANIFEST_DIR}")


def local_manifest_path(cluster: Cluster) -> Path:
    return cluster.state_dir / "data" / LOCAL_MANIFEST


def read_local_manifest(cluster: Cluster) -> dict | None:
    path = local_manifest_path(cluster)
    try:
        return check_manifest(json.loads(path.read_text()), str(path))
    except FileNotFoundError:
        return None
    except UnsafeName as e:
        raise FatpipeError(f"{e}; `fatpipe data push {cluster.name}` writes it again", exit_code=2) from None
    except ValueError:
        raise FatpipeError(f"{path}: unreadable (not JSON); `fatpipe data push {cluster.name}` writes it again",
                           exit_code=2) from None


def local_hash_cache(cluster: Cluster, chunk_size: int) -> HashCache:
    return HashCache(local_manifest_path(cluster).with_name(LOCAL_HASHES), chunk_size)


def save_local_manifest(cluster: Cluster, manifest: dict) -> Path:
    return write_json_atomic(local_manifest_path(cluster), manifest)


def node_workdir(outputs, node) -> str:
    """The project folder on an ssh node, as runs use it (relative to the login's home unless absolute)."""
    return node.remote_dir or remote_dir(outputs.name, node.name)


def ship_checker(cluster: Cluster, t: Transport, workdir: str) -> None:
    """The trainer package and the manifest folder onto one ssh node, into a project folder
    that is fatpipe's (claimed first, as every push does: docs/ARCHITECTURE.md, "The project
    folder on a node"); a remote source's fetch runs from there."""
    claim_project_dir(t, workdir, cluster.name, cluster.project.project_id)
    steps = (
        *(("copy the trainer", src, f"{workdir}/{dest}", SYNC_EXCLUDES) for src, dest in shipped_packages()),
        ("copy the manifest", local_manifest_path(cluster).parent, f"{workdir}/{MANIFEST_DIR}",
         (LOCAL_HASHES,)),
    )
    for what, src, dest, excludes in steps:
        done = t.push(Path(src), dest, excludes, timeout=600)
        if not done.ok:
            raise FatpipeError(f"{t.describe()}: {what} failed: {done.reason()}")


def check_node(cluster: Cluster, node, t: Transport, python: str, rehash: bool = False,
               prune: bool = False) -> NodeData:
    """One round trip: claim the node's project folder (docs/ARCHITECTURE.md, "The project folder
    on a node"), write the manifest there and check the data against it, with the node's system
    Python and the check's modules sent along (`nodeprogram`): nothing is copied first."""
    project, outputs = cluster.project, cluster.outputs
    workdir = node_workdir(outputs, node)
    # --own: the folder is claimed in the same program, so the dataset folder may be fatpipe's alone.
    flags = (["--rehash"] if rehash else []) + (["--prune", "--own"] if prune else [])
    manifest_rel = f"{MANIFEST_DIR}/{LOCAL_MANIFEST}"
    claim = (workdir, outputs.name, project.project_id)
    line = program_line("fatpipe.trainer.staging.check", ["check", *flags, manifest_rel, "."],
                        {manifest_rel: local_manifest_path(cluster).read_text()}, claim=claim)
    done = t.run(boot_command(python), timeout=CHECK_TIMEOUT_S, stdin_text=line)
    said, lines = claimed(done.stdout)
    if said is None:
        raise FatpipeError(f"{t.describe()}: the project folder {workdir}: {done.reason()}")
    judge_claim(t, workdir, outputs.name, project.project_id, said)
    blocked = next((line[len(IN_THE_WAY_PREFIX):] for line in lines if line.startswith(IN_THE_WAY_PREFIX)), None)
    if blocked:  # a file of the user's where the data goes: nothing written there
        raise FatpipeError(f"{t.describe()}: {blocked}", exit_code=2)
    pruned = next((json.loads(line[len(PRUNED_PREFIX):]) for line in lines if line.startswith(PRUNED_PREFIX)), [])
    if done.ok:
        return NodeData(node.name, None, tuple(pruned))
    if done.returncode == 1 and lines:
        return NodeData(node.name, lines[-1], tuple(pruned))
    raise FatpipeError(f"{t.describe()}: could not check its data: {done.reason()}")


def check_data(cluster: Cluster, manifest: dict, python: str | None = None, rehash: bool = False,
               prune: bool = False) -> list[NodeData]:
    """Every node's verdict, in node order (nodes sharing this machine's files: one check for all).

    Each node skips files its hash cache knows unchanged; `rehash` reads every file again. `prune`
    (a push) removes what the manifest does not list and fatpipe staged (trainer/staging/record.py:
    in the project folder of nodes sharing this machine's files, only what its record names),
    refuses a file it did not stage where the data goes, and keeps the manifest beside data that matches."""
    project, outputs, transports = cluster.project, cluster.outputs, cluster.transports()
    if all(t.shares_fs for t in transports):
        try:
            problem, removed = verdict(manifest, project.root, rehash, prune)
        except UnsafeName as e:
            raise FatpipeError(str(e)) from None
        except InTheWay as e:
            raise FatpipeError(str(e), exit_code=2) from None
        # One folder for all: what was removed is told once.
        return [NodeData(node.name, problem, tuple(removed) if i == 0 else ()) for i, node in enumerate(outputs.nodes)]
    if any(t.shares_fs for t in transports):
        raise FatpipeError(f"cluster {outputs.name} mixes ssh nodes with local ones; data staging needs one kind")
    pairs = list(zip(outputs.nodes, transports, strict=True))
    return fan_out(lambda p: check_node(cluster, p[0], p[1], python or "python3", rehash, prune), pairs)


def require_data(cluster: Cluster, python: str | None = None) -> dict | None:
    """Refuse, in one line naming the node and the file, when a node's data differs from the manifest.

    Returns the manifest checked against; None when the cluster declares no [data].
    """
    if cluster.data is None:
        return None
    outputs = cluster.outputs
    manifest = read_local_manifest(cluster)
    if manifest is None:
        raise FatpipeError(f"cluster {outputs.name} declares [data] but none was staged: run "
                           f"`fatpipe data push {outputs.name}`")
    bad = [v for v in check_data(cluster, manifest, python) if v.problem]
    if bad:
        shown = "; ".join(f"node {v.node}: {v.problem}" for v in bad)
        raise FatpipeError(f"data differs from the manifest on {shown} (`fatpipe data push {outputs.name}` "
                           "fixes it)")
    return manifest
