"""`fatpipe data push`: the dataset goes once over the operator's uplink, then node to node.

1. Hash the source into the manifest (files whose size and mtime did not change keep their hashes).
2. Every node checks what it holds (`ops.data.datacheck`); when all match, nothing moves.
3. rsync over the cluster's ssh transport to node 0 (`ops.data.uplink`: an interrupted copy resumes, a
   file that matches is skipped), unless node 0 already matches.
4. Meanwhile `trainer.staging.stage` starts through the launch path (as netcheck runs its benchmark), its
   rank 0 waiting for the copy: a pipelined chain of chunks over the private links, carrying only
   the chunks some node lacks.
Nodes that share this machine's files get one local copy. A remote source (s3://, https://) is
fetched by every node itself instead (`ops.data.fetch`). docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import json
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

STAGE_MODULE = "fatpipe.trainer.staging.stage"
RESULT_PREFIX, PROGRESS_PREFIX = "STAGE_JSON ", "STAGE_PROGRESS "  # as trainer.staging.stage prints them
STARTUP_ALLOWANCE_S = 180
UPLINK_TIMEOUT_S = 24 * 3600

Log = Callable[[str], None]
Progress = Callable[[int, int], None]  # (bytes moved over the private links, bytes to move)


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


def fan_out_chain(project, outputs, manifest: dict, remote_python: str | None, log: Log,
                  progress: Progress | None, source_ready: str | None = None) -> dict:
    """Run trainer.staging.stage on every node through the launch path; returns rank 0's report.

    With `source_ready` (a path in node 0's project folder), rank 0 first waits for the uplink copy's word."""
    from fatpipe.infra.defaults import BENCH_MAX_RESTARTS
    from fatpipe.infra.files import write_json_atomic
    from fatpipe.infra.runs import new_run_id

    from ..rdzv.rendezvous import RunOptions
    from ..run.launch import run_on_all_nodes

    run_dir = project.state_dir(outputs.name) / "stage" / new_run_id()
    run_dir.mkdir(parents=True)
    manifest_rel = write_json_atomic(run_dir / "manifest.json", manifest).relative_to(project.root).as_posix()
    found: list[dict] = []
    moved: dict[str, tuple[int, int]] = {}

    def catch(node: str, line: str) -> None:
        # Found anywhere in the line: torchrun may prefix a worker's output.
        result_at, progress_at = line.find(RESULT_PREFIX), line.find(PROGRESS_PREFIX)
        if result_at >= 0:
            found.append(json.loads(line[result_at + len(RESULT_PREFIX):]))
        elif progress_at >= 0:
            _rank, done, total = (int(x) for x in line[progress_at + len(PROGRESS_PREFIX):].split())
            moved[node] = (done, total)
            if progress:
                progress(sum(d for d, _ in moved.values()), sum(t for _, t in moved.values()))
        elif line.strip():
            log(f"{node}: {line}")

    link_s = manifest["total_bytes"] * 8 / (outputs.tier_gbps * 1e9)
    timeout = STARTUP_ALLOWANCE_S + 4 * link_s + 2 * len(outputs.nodes) * manifest["chunk_size"] * 8 / 1e8
    log(f"fan-out: {len(outputs.nodes)} nodes in a chain over the private links, up to {timeout:.0f} s"
        + (" after the uplink copy" if source_ready else ""))
    entry = ["-m", STAGE_MODULE, "--manifest", manifest_rel]
    if source_ready:
        entry += ["--source-ready", source_ready, "--wait-s", str(UPLINK_TIMEOUT_S)]
        timeout += UPLINK_TIMEOUT_S
    options = RunOptions(nproc_per_node=1, max_restarts=BENCH_MAX_RESTARTS, remote_python=remote_python)
    result = run_on_all_nodes(project, outputs, entry,
                              run_dir=run_dir, options=options, timeout_s=timeout, sink=catch, log=log)
    report = found[-1] if found else None
    problems = [f"{n['node']}: {n['problem']}" for n in (report or {}).get("nodes", []) if n.get("problem")]
    if problems or not result.ok or report is None:
        why = "; ".join(problems) or ("interrupted" if result.interrupted else result.failure) or \
            f"exit status {result.exit_code}"
        logs = run_dir.relative_to(project.root)
        raise FatpipeError(f"data fan-out failed: {why} (node logs in {logs}/node-<rank>.log; run the push "
                           "again: it resumes)", exit_code=result.exit_code or 1)
    return report
