"""Write a run's rendezvous: rendezvous.json, node-<rank>.env and node-<rank>.sh, from the outputs.

c10d rendezvous on node 0's private IP, private IPs only (no hostnames, so no FQDN or DNS
failures), each node's interface resolved on the node itself, and per node the exact torchrun
command, runnable by hand from the project folder on that node: `bash <run>/node-<rank>.sh`.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.clusters import shares_kernel
from fatpipe.infra.defaults import (
    JOIN_TIMEOUT_S,
    MAX_RESTARTS,
    RENDEZVOUS_FILE,
)
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_atomic, write_json_atomic
from fatpipe.infra.node import DEFAULT_REMOTE_DIR, REMOTE_VENV
from fatpipe.infra.tiers import tier_name, tier_profile
from fatpipe.node import env as node_env
from fatpipe.trainer.live.quorum import bind_address, majority

from ..reach.cluster import Cluster
from .faultmode import choose_fault_mode, refuse_live_across_regions
from .nodefiles import (
    LIVE_LIGHTHOUSE,
    LIVE_PORTS_PER_NODE,
    LIVE_RELAY,
    live_port,
    node_env_text,
    node_script_text,
    torchrun_command,
)
from .record import NodePlan, Rendezvous
from .regionenv import node_regions, region_env

TRAINER_MODULE = "fatpipe.trainer"
# What a live run adds to every node's environment (trainer.live.manager reads them).
LIVE_ENV = (node_env.LIVE_LIGHTHOUSE, node_env.LIVE_MIN_REPLICAS, node_env.NODES)
REMOTE_DIR_ENV = "FATPIPE_REMOTE_DIR"  # where the project folder goes on ssh nodes; {cluster}, {node}

@dataclass(frozen=True)
class RunOptions:
    """How a run starts on the nodes: torchrun's settings and the interpreter on ssh nodes."""

    nproc_per_node: int | None = None  # default: the cluster's gpus_per_node, else 1
    max_restarts: int = MAX_RESTARTS
    join_timeout_s: int = JOIN_TIMEOUT_S
    remote_python: str | None = None  # ssh nodes: an interpreter that has torch, instead of a venv


DEFAULT_RUN = RunOptions()


def remote_dir(cluster: str, node: str, template: str | None = None) -> str:
    """The project folder on an ssh node: $FATPIPE_REMOTE_DIR (with {cluster}, {node}) or the default."""
    template = template or os.environ.get(REMOTE_DIR_ENV) or DEFAULT_REMOTE_DIR
    try:
        return template.format(cluster=cluster, node=node)
    except (KeyError, IndexError) as e:
        raise FatpipeError(f"remote dir {template!r}: unknown placeholder {e}; use {{cluster}} or {{node}}") from None


def trainer_entry(run_rel: str, train_args: list[str]) -> list[str]:
    return ["-m", TRAINER_MODULE, "--out", run_rel, *train_args]


def script_entry(project_root: Path, script_args: list[str], shared_fs: bool) -> list[str]:
    """The user's `SCRIPT ARGS` (or `-m MODULE ARGS`), the script made relative to the project folder."""
    if not script_args:
        raise FatpipeError("no script given")
    first = script_args[0]
    if first in ("-m", "--module") or first.startswith("-"):
        return list(script_args)
    path = Path(first).expanduser().resolve()
    if not path.is_file():
        raise FatpipeError(f"{first}: no such script")
    try:
        shown = str(path.relative_to(project_root.resolve()))
    except ValueError:
        if not shared_fs:
            raise FatpipeError(
                f"{first} lies outside the project folder {project_root}, which is what gets copied to the nodes"
            ) from None
        shown = str(path)
    return [shown, *script_args[1:]]


def new_rendezvous(cluster: Cluster, run_id: str, run_dir: Path, *, train=None,
                   script: list[str] | None = None, entry: list[str] | None = None,
                   options: RunOptions = DEFAULT_RUN) -> Rendezvous:
    """Plan a run's rendezvous and write it into `run_dir`: rendezvous.json and each node's .env
    and .sh. The run is the user's `script` (with args), or an `entry` as torchrun takes it
    (netcheck's benchmark), or else the built-in trainer with `train` (a TrainSpec; default the
    project's [train], whose settings a script's run gets too)."""
    project, outputs = cluster.project, cluster.outputs
    spec = train or project.train
    runs = "entry" if entry else "script" if script else "trainer"
    fault = choose_fault_mode(spec, len(outputs.nodes), runs)
    refuse_live_across_regions(spec, fault.mode, runs, list(node_regions(outputs, run_dir).values()))
    live = fault.mode == "live"
    if live and entry:
        raise FatpipeError("fault_tolerance = \"live\" runs the built-in trainer or a script "
                           "through fatpipe.trainer.api, not a torchrun entry of its own")
    # The trainer is told the mode in force, never `auto`.
    train_args = spec.model_copy(update={"fault_tolerance": fault.mode}).trainer_args()
    if script:
        shared = all(node.transport in ("local", "netns") for node in outputs.nodes)
        entry = script_entry(project.root, script, shared)
    rdzv = _plan(cluster, run_id, run_dir, entry, train_args, options, live)
    rdzv.fault_why, rdzv.fault_auto = fault.why, fault.auto
    _write(rdzv, run_dir)
    return rdzv


def restart_instead(rdzv: Rendezvous, run_dir: Path, why: str) -> Rendezvous:
    """An `auto` run's live plan turned to restart (a node the environment check found without
    torchft), its files written again; the given `rdzv` is left as it was."""
    rdzv = copy.deepcopy(rdzv)
    flag = rdzv.entry.index("--fault-tolerance") + 1
    rdzv.entry[flag] = "restart"
    rdzv.fault_tolerance, rdzv.fault_why = "restart", f"auto: {why}"
    rdzv.lighthouse, rdzv.lighthouses, rdzv.min_replicas = None, [], 1
    for node in rdzv.nodes:
        node.env = {k: v for k, v in node.env.items() if k not in LIVE_ENV}
        node.command = torchrun_command(rdzv, node)
    _write(rdzv, run_dir)
    return rdzv


def _plan_live(rdzv: Rendezvous, outputs) -> None:
    """Every node's Lighthouse (node 0's alone below 3 nodes), and each node's relay to the
    serving one, with the quorum's majority (docs/ARCHITECTURE.md, "Live fault tolerance")."""
    nnodes = rdzv.nnodes
    if outputs.rdzv_port + LIVE_PORTS_PER_NODE * nnodes > 65536:
        raise FatpipeError(f"rdzv_port {outputs.rdzv_port} leaves no room for {nnodes} nodes' "
                           f"stores, Lighthouses and relays past it (fault_tolerance = \"live\", "
                           f"{LIVE_PORTS_PER_NODE} ports a node): use a lower port")
    rdzv.fault_tolerance = "live"
    rdzv.min_replicas = majority(nnodes)
    serving = rdzv.nodes if rdzv.min_replicas > 1 else rdzv.nodes[:1]
    rdzv.lighthouses = [bind_address(n.private_ip, live_port(rdzv, n.rank, LIVE_LIGHTHOUSE))
                        for n in serving]
    rdzv.lighthouse = rdzv.lighthouses[0]
    for node in rdzv.nodes:
        node.env |= dict(zip(LIVE_ENV, (f"127.0.0.1:{live_port(rdzv, node.rank, LIVE_RELAY)}",
                                        str(rdzv.min_replicas), str(nnodes)), strict=True))


def _plan(cluster: Cluster, run_id: str, run_dir: Path, entry: list[str] | None,
          train_args: list[str], options: RunOptions, live: bool = False) -> Rendezvous:
    project, outputs = cluster.project, cluster.outputs
    run_rel = Path(os.path.relpath(run_dir, project.root)).as_posix()
    if run_rel.startswith(".."):
        raise FatpipeError(f"run folder {run_dir} must lie inside the project folder {project.root}")
    builtin = entry is None
    if builtin:
        entry = trainer_entry(run_rel, train_args)
    nproc = options.nproc_per_node or outputs.gpus_per_node or 1
    nnodes = len(outputs.nodes)
    nodes = [
        _node_plan(project, outputs, rank, node, nnodes * nproc, options.remote_python)
        for rank, node in enumerate(outputs.nodes)
    ]
    rdzv = Rendezvous(
        run_id=run_id, cluster=outputs.name, provider=outputs.provider, nnodes=nnodes,
        nproc_per_node=nproc, rdzv_backend="c10d", rdzv_endpoint=outputs.rdzv_endpoint,
        max_restarts=options.max_restarts, join_timeout_s=options.join_timeout_s, run_rel=run_rel,
        entry=list(entry),
        builtin_trainer=builtin, tier_gbps=outputs.tier_gbps,
        gpus_per_node=outputs.gpus_per_node, data_path=cluster.data.path if cluster.data else None,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), nodes=nodes,
    )
    if live:
        _plan_live(rdzv, outputs)
    regions = region_env(outputs, run_dir)
    for node in nodes:
        node.env |= regions.get(node.name, {})
    for node in nodes:
        node.command = torchrun_command(rdzv, node)
        if not builtin:  # where a script using fatpipe.trainer.api finds its run (trainer/api/__init__.py)
            node.env |= {node_env.RUN_DIR: run_rel, node_env.TRAIN_ARGS: shlex.join(train_args)}
    return rdzv


def _node_plan(project, outputs, rank: int, node, world: int, remote_python: str | None) -> NodePlan:
    shared = node.transport in ("local", "netns")
    env = node_env.NodeEnv(cluster=outputs.name, node_name=node.name, node_rank=rank,
                           private_ip=node.private_ip, tier_gbps=outputs.tier_gbps).to_environ()
    env["PYTHONUNBUFFERED"] = "1"  # the per-node log streams line by line, not in 8 KiB blocks
    env |= outputs.nccl or _tier_nccl(outputs.tier_gbps)  # outputs from before they carried it
    if shared or shares_kernel(outputs.provider):
        # Sim nodes share one machine, over ssh too: NCCL would use shared memory and bypass the
        # shaped links, and every rank using every core would oversubscribe the CPUs.
        env |= {"NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1",
                "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
    if shared:
        workdir, python = str(project.root), sys.executable
    else:
        workdir = node.remote_dir or remote_dir(outputs.name, node.name)
        python = remote_python or f"{REMOTE_VENV}/bin/python"
    return NodePlan(
        rank=rank, name=node.name, transport=node.transport, private_ip=node.private_ip,
        public_ip=node.public_ip, netns=node.netns, workdir=workdir, python=python,
        ssh_user=node.ssh_user or outputs.ssh_user, ssh_port=node.ssh_port, ssh_key_file=node.ssh_key_file,
        ssh_host=node.ssh_host, env=env,
    )


def _tier_nccl(gbps: float) -> dict[str, str]:
    """NCCL socket settings of the tier (threads and sockets per peer): nodes of every provider get them."""
    return dict(tier_profile(tier_name(gbps)).nccl)


def _write(rdzv: Rendezvous, run_dir: Path) -> Path:
    """Write rendezvous.json and each node's .env and .sh into `run_dir`; returns the json path."""
    run_dir = Path(run_dir)
    for node in rdzv.nodes:
        write_atomic(run_dir / f"node-{node.rank}.env", node_env_text(rdzv, node))
        write_atomic(run_dir / f"node-{node.rank}.sh", node_script_text(rdzv, node), mode=0o755)
    return write_json_atomic(run_dir / RENDEZVOUS_FILE, rdzv.to_json())


def read_rendezvous(run_dir: Path) -> Rendezvous:
    path = Path(run_dir) / RENDEZVOUS_FILE
    try:
        return Rendezvous.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise FatpipeError(f"{path}: no rendezvous (fatpipe rendezvous)") from None
    except (ValueError, TypeError, KeyError) as e:
        raise FatpipeError(f"{path}: not a fatpipe rendezvous ({e})") from None
