"""Write a run's rendezvous: rendezvous.json, node-<rank>.env and node-<rank>.sh, from the outputs.

c10d rendezvous on node 0's private IP, private IPs only (no hostnames, so no FQDN or DNS
failures), each node's interface resolved on the node itself, and per node the exact torchrun
command, runnable by hand from the project folder on that node: `bash <run>/node-<rank>.sh`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fatpipe.infra.defaults import JOIN_TIMEOUT_S, MAX_RESTARTS, RENDEZVOUS_FILE
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_atomic, write_json_atomic
from fatpipe.infra.tiers import tier_name, tier_profile

TRAINER_MODULE = "fatpipe.trainer"
REMOTE_DIR_ENV = "FATPIPE_REMOTE_DIR"  # where the project folder goes on ssh nodes; {cluster}, {node}
DEFAULT_REMOTE_DIR = "fatpipe/{cluster}"  # relative to the login user's home
REMOTE_VENV = ".fatpipe/venv"  # inside the project folder on the node
REMOTE_PKG = ".fatpipe/pkg"  # the built-in trainer, shipped as fatpipe/trainer on PYTHONPATH

# The interface holding the node's private IP: an exact address match first, else the longest
# prefix holding it (127.0.0.0/8 on lo holds every loopback node's 127.x address).
IFACE_AWK = r"""
function n(a,  p) { split(a, p, "."); return ((p[1] * 256 + p[2]) * 256 + p[3]) * 256 + p[4] }
{ split($4, c, "/")
  if (c[1] == want) { exact = $2; exit }
  m = 2 ^ (32 - c[2])
  if (int(n(c[1]) / m) == int(n(want) / m) && c[2] + 0 > best) { best = c[2] + 0; dev = $2 } }
END { if (exact != "") print exact; else if (dev != "") print dev }
""".strip()


@dataclass(frozen=True)
class RunOptions:
    """How a run starts on the nodes: torchrun's settings and the interpreter on ssh nodes."""

    nproc_per_node: int | None = None  # default: the cluster's gpus_per_node, else 1
    max_restarts: int = MAX_RESTARTS
    join_timeout_s: int = JOIN_TIMEOUT_S
    remote_python: str | None = None  # ssh nodes: an interpreter that has torch, instead of a venv


DEFAULT_RUN = RunOptions()


@dataclass
class NodePlan:
    """One node's part of a run: where it is, where its project folder is, what it runs with."""

    rank: int
    name: str
    transport: str
    private_ip: str
    public_ip: str | None
    netns: str | None
    workdir: str  # the project folder on the node (ssh: relative to the login home)
    python: str  # the interpreter that runs torchrun there
    ssh_user: str = ""
    ssh_port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)


@dataclass
class Rendezvous:
    """Everything `rendezvous.json` records; `run_rel` is the run folder relative to a workdir."""

    run_id: str
    cluster: str
    provider: str
    nnodes: int
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    max_restarts: int
    join_timeout_s: int
    run_rel: str
    entry: list[str]
    builtin_trainer: bool
    ships_trainer: bool  # the entry runs a fatpipe.trainer module: ssh nodes get the package
    tier_gbps: float
    created: str
    nodes: list[NodePlan]
    gpus_per_node: int = 0  # from the outputs: ssh nodes with GPUs get torch's CUDA build

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> Rendezvous:
        nodes = [NodePlan(**n) for n in doc["nodes"]]
        return cls(**{**doc, "nodes": nodes})


def remote_dir(cluster: str, node: str, template: str | None = None) -> str:
    """The project folder on an ssh node: $FATPIPE_REMOTE_DIR (with {cluster}, {node}) or the default."""
    template = template or os.environ.get(REMOTE_DIR_ENV) or DEFAULT_REMOTE_DIR
    try:
        return template.format(cluster=cluster, node=node)
    except (KeyError, IndexError) as e:
        raise FatpipeError(f"remote dir {template!r}: unknown placeholder {e}; use {{cluster}} or {{node}}") from None


def runs_trainer_module(entry: list[str]) -> bool:
    """Whether `entry` is `-m fatpipe.trainer[.x]`: then ssh nodes need the package shipped."""
    return len(entry) > 1 and entry[0] == "-m" and entry[1].split(".")[:2] == ["fatpipe", "trainer"]


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


def plan_rendezvous(project, outputs, run_id: str, run_dir: Path, entry: list[str] | None = None,
                    train_args: list[str] | None = None, options: RunOptions = DEFAULT_RUN) -> Rendezvous:
    """The rendezvous of one run: `entry` is the user's script and args, None for the built-in trainer."""
    run_rel = Path(os.path.relpath(run_dir, project.root)).as_posix()
    if run_rel.startswith(".."):
        raise FatpipeError(f"run folder {run_dir} must lie inside the project folder {project.root}")
    builtin = entry is None
    if builtin:
        entry = trainer_entry(run_rel, train_args if train_args is not None else project.train.trainer_args())
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
        builtin_trainer=builtin, ships_trainer=runs_trainer_module(entry), tier_gbps=outputs.tier_gbps,
        gpus_per_node=outputs.gpus_per_node, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), nodes=nodes,
    )
    for node in nodes:
        node.command = torchrun_command(rdzv, node)
    return rdzv


def _node_plan(project, outputs, rank: int, node, world: int, remote_python: str | None) -> NodePlan:
    shared = node.transport in ("local", "netns")
    env = {
        "FATPIPE_CLUSTER": outputs.name,
        "FATPIPE_NODE_NAME": node.name,
        "FATPIPE_NODE_RANK": str(rank),
        "FATPIPE_PRIVATE_IP": node.private_ip,
        "FATPIPE_TIER_GBPS": f"{outputs.tier_gbps:g}",
        "PYTHONUNBUFFERED": "1",  # the per-node log streams line by line, not in 8 KiB blocks
    }
    env |= _tier_nccl(outputs.tier_gbps)
    if shared:
        # Sim nodes share one machine: NCCL would use shared memory and bypass the shaped links,
        # and every rank using every core would oversubscribe the CPUs.
        env |= {"NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1",
                "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
        workdir, python = str(project.root), sys.executable
    else:
        workdir = remote_dir(outputs.name, node.name)
        python = remote_python or f"{REMOTE_VENV}/bin/python"
    return NodePlan(
        rank=rank, name=node.name, transport=node.transport, private_ip=node.private_ip,
        public_ip=node.public_ip, netns=node.netns, workdir=workdir, python=python,
        ssh_user=node.ssh_user or outputs.ssh_user, ssh_port=node.ssh_port, env=env,
    )


def _tier_nccl(gbps: float) -> dict[str, str]:
    """NCCL socket settings of the tier (threads and sockets per peer): nodes of every provider get them."""
    return dict(tier_profile(tier_name(gbps)).nccl)


def make_rendezvous(project, outputs, run_id: str, run_dir: Path, train=None,
                    script: list[str] | None = None, options: RunOptions = DEFAULT_RUN) -> Rendezvous:
    """Plan and write a run's rendezvous: the user's `script` (with args) or the built-in trainer.

    `train` is the TrainSpec for the built-in trainer (default: the project's [train]).
    """
    if script:
        shared = all(node.transport in ("local", "netns") for node in outputs.nodes)
        entry, train_args = script_entry(project.root, script, shared), None
    else:
        entry, train_args = None, (train or project.train).trainer_args()
    rdzv = plan_rendezvous(project, outputs, run_id, run_dir, entry=entry, train_args=train_args, options=options)
    write_rendezvous(rdzv, run_dir)
    return rdzv


def torchrun_command(rdzv: Rendezvous, node: NodePlan) -> list[str]:
    """torchrun's arguments for one node (after the interpreter)."""
    # Only node 0 hosts the c10d store: on one machine (loopback nodes) torchrun's own guess
    # would make every node think it is the host.
    conf = f"is_host={int(node.rank == 0)},join_timeout={rdzv.join_timeout_s},read_timeout={rdzv.join_timeout_s}"
    return [
        "-m", "torch.distributed.run",
        "--nnodes", str(rdzv.nnodes), "--nproc-per-node", str(rdzv.nproc_per_node),
        "--rdzv-backend", rdzv.rdzv_backend, "--rdzv-endpoint", rdzv.rdzv_endpoint,
        "--rdzv-id", rdzv.run_id, "--rdzv-conf", conf,
        "--max-restarts", str(rdzv.max_restarts), "--local-addr", node.private_ip,
        *rdzv.entry,
    ]


def node_env_text(rdzv: Rendezvous, node: NodePlan) -> str:
    lines = [
        f"# fatpipe run {rdzv.run_id}, node {node.name} (rank {node.rank} of {rdzv.nnodes}); sourced by",
        f"# node-{node.rank}.sh, which also sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME on the node",
        f"# to the interface that holds {node.private_ip}.",
    ]
    lines += [f"{key}={shlex.quote(value)}" for key, value in node.env.items()]
    return "\n".join(lines) + "\n"


def node_script_text(rdzv: Rendezvous, node: NodePlan) -> str:
    depth = len(Path(rdzv.run_rel).parts)
    up = "/".join([".."] * depth)
    # One flag (with its value) per line, so the command reads like torchrun's docs.
    body = " \\\n  ".join(_group([shlex.quote(a) for a in node.command]))
    pythonpath = ""
    if node.transport == "ssh" and rdzv.ships_trainer:
        pythonpath = f'export PYTHONPATH="$PWD/{REMOTE_PKG}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
    return f"""#!/usr/bin/env bash
# fatpipe run {rdzv.run_id} on cluster {rdzv.cluster}: node {node.name}, rank {node.rank} of {rdzv.nnodes}.
# Runnable by hand on that node, from the project folder: bash {rdzv.run_rel}/node-{node.rank}.sh
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # `ip` lives there on some images, outside a user's PATH
cd "$(dirname "$0")/{up}"
set -a; . "{rdzv.run_rel}/node-{node.rank}.env"; set +a
IFACE=$(ip -o -4 addr show | awk -v want="$FATPIPE_PRIVATE_IP" '{IFACE_AWK}')
if [ -z "$IFACE" ]; then
  echo "fatpipe: no interface on $(hostname) holds $FATPIPE_PRIVATE_IP" >&2
  exit 2
fi
export NCCL_SOCKET_IFNAME="$IFACE" GLOO_SOCKET_IFNAME="$IFACE"
{pythonpath}PY="${{FATPIPE_PYTHON:-{node.python}}}"
exec "$PY" {body}
"""


def _group(args: list[str]) -> list[str]:
    """Pair each `--flag` with its value; the first item is `-m torch.distributed.run`."""
    out, i = [" ".join(args[:2])], 2
    while i < len(args):
        nxt = args[i + 1] if i + 1 < len(args) else None
        if (args[i] == "-m" or args[i].startswith("--")) and nxt is not None and not nxt.startswith("--"):
            out.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out


def write_rendezvous(rdzv: Rendezvous, run_dir: Path) -> Path:
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
