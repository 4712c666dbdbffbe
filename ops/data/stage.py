"""`fatpipe data push`: the dataset goes once over the operator's uplink, then node to node.

1. Hash the source into the manifest (files whose size and mtime did not change keep their hashes).
2. Every node checks what it holds (`ops.data.check`); when all match, nothing moves.
3. `trainer.staging.stage` starts on every node at once (`ops.data.chain`: the node's system Python,
   plain sockets), headed by this machine (`ops.data.head`), which sends node 0 over its ssh session
   the chunks some node lacks and no node before it holds: a pipelined chain of pieces, node 0
   forwarding each over the private links as it lands. An interrupted push leaves partial files
   whose right chunks the next one keeps.
Nodes that share this machine's files get one local copy, into the user's own project folder: it
writes over no file fatpipe did not stage and removes only what its record says it staged
(trainer/staging/record.py). A `path` that holds the source or lies in it is refused first. A
remote source (s3://, https://) is fetched by every node itself instead (`ops.data.fetch`).
docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fatpipe.infra.dataspec import DataSpec
from fatpipe.infra.errors import FatpipeError
from fatpipe.trainer.staging.manifest import (
    PARTIAL_SUFFIX,
    build_manifest,
    file_target,
    hash_file,
    node_cache,
    write_manifest,
)
from fatpipe.trainer.staging.names import UnsafeName, dataset_base, first_link, writable_target

from ..reach.cluster import Cluster
from .chain import Progress, fan_out_chain
from .check import (
    NodeData,
    check_data,
    declared_data,
    local_hash_cache,
    save_local_manifest,
)
from .fetch import fetch_data

Log = Callable[[str], None]


@dataclass
class PushResult:
    manifest: dict
    before: list[NodeData]  # what each node held when the push began
    uplink_s: float | None = None  # None: node 0 already held what the chain needed
    fanout: dict | None = None  # every node's report from the chain; None: no node lacked anything
    fetched: dict[str, int] | None = None  # a remote source: bytes each node fetched from it
    removed: dict[str, list[str]] = field(default_factory=dict)  # per node: files the manifest does not list
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def moved(self) -> int:
        """Bytes that crossed the private links (node 0's came over the uplink)."""
        return sum(n["received"] for n in (self.fanout or {}).get("nodes", [])[1:])

    @property
    def uplinked(self) -> int:
        """Bytes that crossed the operator's uplink, to node 0."""
        return (self.fanout or {}).get("nodes", [{"received": 0}])[0]["received"]


def make_manifest(cluster: Cluster, spec: DataSpec | None = None) -> tuple[dict, Path]:
    """The manifest of the cluster's declared source (`spec`, default its declared [data]; kept in
    .fatpipe/<cluster>/data/), and the source."""
    spec, project = spec or declared_data(cluster), cluster.project
    refuse_overlap(spec, project.root)
    source = spec.source_path(project.root)
    if not source.exists():
        raise FatpipeError(f"data source {spec.source}: no such file or folder ({source})", exit_code=2)
    if not (source.is_file() or source.is_dir()):
        raise FatpipeError(f"data source {spec.source}: neither a file nor a folder", exit_code=2)
    cache = local_hash_cache(cluster, spec.chunk_size)
    try:
        manifest = build_manifest(source, spec.chunk_size, spec.path, cache=cache)
    except UnsafeName as e:  # a link, or a name that is no plain path: nothing leaves this machine
        raise FatpipeError(str(e), exit_code=2) from None
    cache.save()
    save_local_manifest(cluster, manifest)
    return manifest, source


def refuse_overlap(spec, root: Path) -> None:
    """A `path` that holds the source or lies inside it, as written or with links resolved: on
    nodes that share this machine's files a push would write into (and prune) its own source. The
    same folder is the data itself (nothing copied); a folder beside the source is the fix."""
    written = Path(os.path.normpath(root / Path(spec.source).expanduser()))
    as_written = (written, Path(os.path.normpath(root / spec.path)))
    resolved = (spec.source_path(root), (root / spec.path).resolve())
    for source, landing in (as_written, resolved):
        where = "" if (source, landing) == as_written else f" (links resolved: {landing} and {source})"
        if landing in source.parents:
            raise FatpipeError(f"data path {spec.path!r} holds the source {spec.source!r}{where}: a push would "
                               "stage the source into itself; choose a path beside it", exit_code=2)
        if source in landing.parents:
            raise FatpipeError(f"data path {spec.path!r} lies inside the source {spec.source!r}{where}: a push "
                               "would stage the source into itself; choose a path beside it", exit_code=2)


def push_data(cluster: Cluster, *, remote_python: str | None = None, progress: Progress | None = None,
              node_progress=None) -> PushResult:
    """Stage the cluster's [data] on every node, skipping what is there; raise naming a node that failed.

    `progress` follows the fan-out of a local source; `node_progress` each node's fetch of a remote
    one; `cluster.log` takes the progress lines.
    """
    started = time.monotonic()
    outputs, log = cluster.outputs, cluster.log
    spec = declared_data(cluster)
    if spec.remote:
        log(f"every node fetches {spec.source} itself")
        manifest, fetched, removed = fetch_data(cluster, spec, remote_python, node_progress)
        return PushResult(manifest, [], fetched=fetched, removed=removed, elapsed_s=time.monotonic() - started)
    manifest, source = make_manifest(cluster, spec)
    log(f"manifest: {len(manifest['files'])} file(s), {manifest['total_bytes']} bytes, "
        f"fingerprint {manifest['fingerprint'][:12]}")
    transports = cluster.transports()
    if all(t.shares_fs for t in transports):
        return _stage_here(cluster, manifest, source, started)
    before = check_data(cluster, manifest, remote_python, prune=True)
    result = PushResult(manifest, before, removed={v.node: list(v.removed) for v in before if v.removed})
    if before[0].problem:
        log(f"{outputs.nodes[0].name}: {before[0].problem}: sending over the uplink")
    if any(v.problem for v in before):
        result.fanout = fan_out_chain(cluster, manifest, source, remote_python, progress,
                                      uplink=bool(before[0].problem))
        result.uplink_s = result.fanout["uplink_s"]
    result.elapsed_s = time.monotonic() - started
    return result


def _stage_here(cluster: Cluster, manifest: dict, source: Path, started: float) -> PushResult:
    """Nodes that share this machine's files: one copy into the project folder, when it lies
    elsewhere. That folder is the user's: a file fatpipe did not stage in the data's way stops the
    push, and only what its record says it staged goes (trainer/staging/record.py); a source that
    is that folder is the data itself, never pruned."""
    project, outputs = cluster.project, cluster.outputs
    if source == (project.root / manifest["path"]).resolve():
        write_manifest(manifest, project.root)
        return PushResult(manifest, check_data(cluster, manifest), elapsed_s=time.monotonic() - started)
    removed = list(check_data(cluster, manifest, prune=True)[0].removed)  # records what it will write
    _copy_here(manifest, source, project.root)
    verdict = check_data(cluster, manifest, prune=True)  # keeps the manifest beside data that matches
    removed += verdict[0].removed
    return PushResult(manifest, verdict, removed={outputs.nodes[0].name: removed} if removed else {},
                      elapsed_s=time.monotonic() - started)


def _copy_here(manifest: dict, source: Path, root: Path) -> None:
    """Each listed file that is not there right: copied aside, then renamed into place (a new
    inode: a trainer that maps the old one keeps its bytes); a link on its way is replaced."""
    cache, base = node_cache(manifest, root), dataset_base(manifest, root)
    for entry in manifest["files"]:
        target = file_target(manifest, root, entry["name"])
        if first_link(base, target) is None and target.is_file() and target.stat().st_size == entry["size"] and \
                cache.hashes(target, lambda p: hash_file(p, manifest["chunk_size"]))[0] == entry["sha256"]:
            continue
        target = writable_target(base, target)
        part = writable_target(base, target.with_name(target.name + PARTIAL_SUFFIX))
        if os.path.lexists(part):
            os.unlink(part)
        shutil.copyfile(source / entry["name"] if manifest["kind"] == "folder" else source, part)
        os.replace(part, target)
    cache.save()
