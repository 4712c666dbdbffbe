"""`fatpipe data push`: the dataset goes once over the operator's uplink, then node to node.

1. Hash the source into the manifest (files whose size and mtime did not change keep their hashes).
2. Every node checks what it holds (`ops.data.datacheck`); when all match, nothing moves.
3. rsync over the cluster's ssh transport to node 0 (`ops.data.uplink`: an interrupted copy resumes, a
   file that matches is skipped), unless node 0 already matches.
4. Meanwhile `trainer.staging.stage` starts on every node at once (`ops.data.chain`: the node's
   system Python, plain sockets), its place 0 waiting for the copy: a pipelined chain of chunks
   over the private links, carrying only the chunks some node lacks.
Nodes that share this machine's files get one local copy. A remote source (s3://, https://) is
fetched by every node itself instead (`ops.data.fetch`). docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.trainer.staging.manifest import build_manifest, write_manifest
from fatpipe.trainer.staging.names import UnsafeName
from fatpipe.trainer.staging.tidy import prune

from ..reach.transport import transports_for
from .chain import Progress, fan_out_chain
from .datacheck import (
    NodeData,
    check_data,
    declared_data,
    local_hash_cache,
    local_manifest_path,
    node_workdir,
    save_local_manifest,
)
from .uplink import UplinkCopy

Log = Callable[[str], None]


@dataclass
class PushResult:
    manifest: dict
    before: list[NodeData]  # what each node held when the push began
    uplink_s: float | None = None  # None: node 0 already held it
    fanout: dict | None = None  # trainer.staging.stage's report; None: no other node lacked anything
    fetched: dict[str, int] | None = None  # a remote source: bytes each node fetched from it
    removed: dict[str, list[str]] = field(default_factory=dict)  # per node: files the manifest does not list
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def make_manifest(project, cluster: str) -> tuple[dict, Path]:
    """The manifest of the cluster's declared source (kept in .fatpipe/<cluster>/data/), and the source."""
    spec = declared_data(project, cluster)
    source = spec.source_path(project.root)
    if not source.exists():
        raise FatpipeError(f"data source {spec.source}: no such file or folder ({source})", exit_code=2)
    if not (source.is_file() or source.is_dir()):
        raise FatpipeError(f"data source {spec.source}: neither a file nor a folder", exit_code=2)
    cache = local_hash_cache(project, cluster, spec.chunk_size)
    try:
        manifest = build_manifest(source, spec.chunk_size, spec.path, cache=cache)
    except UnsafeName as e:  # a link, or a name that is no plain path: nothing leaves this machine
        raise FatpipeError(str(e), exit_code=2) from None
    cache.save()
    save_local_manifest(project, cluster, manifest)
    return manifest, source


def push_data(project, outputs, *, remote_python: str | None = None, log: Log = lambda _: None,
              progress: Progress | None = None, node_progress=None) -> PushResult:
    """Stage the cluster's [data] on every node, skipping what is there; raise naming a node that failed.

    `progress` follows the fan-out of a local source; `node_progress` each node's fetch of a remote one.
    """
    started = time.monotonic()
    spec = declared_data(project, outputs.name)
    if spec.remote:
        from .fetch import fetch_data

        log(f"every node fetches {spec.source} itself")
        manifest, fetched, removed = fetch_data(project, outputs, spec, remote_python, node_progress, log)
        return PushResult(manifest, [], fetched=fetched, removed=removed, elapsed_s=time.monotonic() - started)
    manifest, source = make_manifest(project, outputs.name)
    log(f"manifest: {len(manifest['files'])} file(s), {manifest['total_bytes']} bytes, "
        f"fingerprint {manifest['fingerprint'][:12]}")
    transports = transports_for(outputs, project.state_dir(outputs.name))
    if all(t.shares_fs for t in transports):
        return _stage_here(project, manifest, source, outputs, started)
    before = check_data(project, outputs, manifest, remote_python, prune=True, log=log)
    result = PushResult(manifest, before, removed={v.node: list(v.removed) for v in before if v.removed})
    if before[0].problem:
        log(f"{outputs.nodes[0].name}: {before[0].problem}: copying over the uplink")
        copy = UplinkCopy(transports[0], node_workdir(outputs, outputs.nodes[0]), source, manifest,
                          local_manifest_path(project, outputs.name))
        copy.start(log)
        try:
            if any(v.problem for v in before[1:]):
                result.fanout = fan_out_chain(project, outputs, manifest, remote_python, log, progress,
                                              source_ready=copy.ready_rel)
        except BaseException:
            failed = copy.failed()  # the chain failed because the copy did: say why the copy did
            copy.stop()
            if failed:
                raise failed from None
            raise
        result.uplink_s = copy.wait()
    elif any(v.problem for v in before[1:]):
        result.fanout = fan_out_chain(project, outputs, manifest, remote_python, log, progress)
    result.elapsed_s = time.monotonic() - started
    return result


def _stage_here(project, manifest: dict, source: Path, outputs, started: float) -> PushResult:
    """Nodes that share this machine's files: one copy into the project folder, when it lies elsewhere
    (made equal to the manifest); a source that is that folder is the user's own, and never pruned."""
    target = project.root / manifest["path"]
    copied = source != target.resolve()
    removed = prune(manifest, project.root) if copied else []  # first: no link left there for rsync to meet
    if copied:
        target.parent.mkdir(parents=True, exist_ok=True)
        src = f"{source}/" if source.is_dir() else str(source)
        done = subprocess.run(["rsync", "-a", "--no-links", "--partial", "--checksum", src, str(target)],
                              capture_output=True, text=True)
        if done.returncode:
            raise FatpipeError(f"copying {source} to {target} failed: {done.stderr.strip()[-300:]}")
    else:
        write_manifest(manifest, project.root)
    verdict = check_data(project, outputs, manifest, prune=copied)  # pruning keeps the manifest beside the data
    removed += verdict[0].removed
    return PushResult(manifest, verdict, removed={outputs.nodes[0].name: removed} if removed else {},
                      elapsed_s=time.monotonic() - started)
