"""The files one run puts beside each node: node-<rank>.env, node-<rank>.sh (the exact torchrun
command, runnable by hand on that node) and rendezvous.json."""

from __future__ import annotations

import shlex
from pathlib import Path

from fatpipe.infra.defaults import GROUP_RANK_FILE, RUN_PORTS_PER_NODE, TORCHRUN_DIR
from fatpipe.infra.node import REMOTE_PKG
from fatpipe.node import env as node_env

from .record import NodePlan, Rendezvous

LIVE_STORE, LIVE_LIGHTHOUSE, LIVE_RELAY = range(3)
LIVE_PORTS_PER_NODE = RUN_PORTS_PER_NODE  # the host firewall admits only the nodes to them

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

USER_SCRIPT_MODULE = "fatpipe.trainer.api.userscript"  # runs a user script with per-rank error files
# torchrun through trainer.agent: a signal it handled ends it by that signal, so the node's
# supervisor reads a stop or a kill from its exit status, not from its log.
TORCHRUN = ["-m", "fatpipe.trainer.agent", "torch.distributed.run"]


def torchrun_log_dir(rdzv: Rendezvous, rank: int) -> str:
    """torchrun's --log-dir for a node, relative to the project folder: every worker's error
    file lands in the run folder (`<run>/torchrun/node-<rank>/<id>_*/attempt_<n>/<local rank>/error.json`)."""
    return f"{rdzv.run_rel}/{TORCHRUN_DIR}/node-{rank}"


def group_rank_file(rdzv: Rendezvous, index: int) -> str:
    """Where node `index` records the group rank torch gave it, relative to the project folder."""
    return f"{rdzv.run_rel}/{GROUP_RANK_FILE.format(index=index)}"


def planned_group_ranks(addresses: list[str]) -> list[int]:
    """The group rank torch's c10d rendezvous gives each node: it sorts its participants by
    their `--local-addr` as a string (torch 2.13 `DynamicRendezvousHandler`), so 10.0.0.10 comes
    before 10.0.0.9. The nodes' own records (`group_rank_file`) say what it did."""
    order = sorted(range(len(addresses)), key=lambda i: addresses[i])
    ranks = [0] * len(addresses)
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def runs_trainer_module(entry: list[str]) -> bool:
    """Whether `entry` is `-m fatpipe.trainer[.x]`, a module that records its own errors."""
    return len(entry) > 1 and entry[0] == "-m" and entry[1].split(".")[:2] == ["fatpipe", "trainer"]


def worker_entry(entry: list[str]) -> list[str]:
    """What torchrun starts: a fatpipe.trainer module as it is (it records its own errors), any
    other script or module through trainer.api.userscript, which records its first exception."""
    return list(entry) if runs_trainer_module(entry) else ["-m", USER_SCRIPT_MODULE, *entry]


def live_port(rdzv: Rendezvous, rank: int, what: int) -> int:
    """Node `rank`'s ports under live fault tolerance, three per node from the rendezvous port:
    its store (`LIVE_STORE`), its Lighthouse (`LIVE_LIGHTHOUSE`) and its relay to the serving
    Lighthouse (`LIVE_RELAY`). Distinct, since a store listens on every address and loopback sim
    nodes share this machine's ports."""
    port = int(rdzv.rdzv_endpoint.rpartition(":")[2])
    return port + LIVE_PORTS_PER_NODE * rank + what


def lighthouse_args(rdzv: Rendezvous, rank: int) -> list[str]:
    """trainer.live.lighthouse's arguments on node `rank`: its relay, and its own Lighthouse
    where the run has one on this node."""
    args = ["--relay-port", str(live_port(rdzv, rank, LIVE_RELAY)),
            "--lighthouses", ",".join(rdzv.lighthouses)]
    if rank < len(rdzv.lighthouses):
        host, _, port = rdzv.lighthouses[rank].rpartition(":")
        args += ["--host", host.strip("[]"), "--port", port, "--min-replicas", str(rdzv.min_replicas)]
    return args


def torchrun_command(rdzv: Rendezvous, node: NodePlan) -> list[str]:
    """torchrun's arguments for one node (after the interpreter).

    Under live fault tolerance every node is a group of its own: its torchrun hosts its own
    store on its private IP (where the other nodes' replica groups meet it) and waits for nobody.
    """
    # Only node 0 hosts the c10d store: on one machine (loopback nodes) torchrun's own guess
    # would make every node think it is the host.
    host = rdzv.live or node.rank == 0
    conf = f"is_host={int(host)},join_timeout={rdzv.join_timeout_s},read_timeout={rdzv.join_timeout_s}"
    nnodes, endpoint = (1, f"{node.private_ip}:{live_port(rdzv, node.rank, LIVE_STORE)}") \
        if rdzv.live else (rdzv.nnodes, rdzv.rdzv_endpoint)
    return [
        *TORCHRUN,
        "--nnodes", str(nnodes), "--nproc-per-node", str(rdzv.nproc_per_node),
        "--rdzv-backend", rdzv.rdzv_backend, "--rdzv-endpoint", endpoint,
        "--rdzv-id", rdzv.run_id, "--rdzv-conf", conf,
        "--max-restarts", str(rdzv.max_restarts), "--local-addr", node.private_ip,
        "--log-dir", torchrun_log_dir(rdzv, node.rank),
        *worker_entry(rdzv.entry),
    ]


def node_env_text(rdzv: Rendezvous, node: NodePlan) -> str:
    group = planned_group_ranks([n.private_ip for n in rdzv.nodes])[node.rank]
    lines = [
        f"# fatpipe run {rdzv.run_id}, node {node.name} (node {node.rank} of {rdzv.nnodes}; torch's group rank "
        f"{group}, as planned); sourced by",
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
    exports = ""
    if rdzv.data_path:  # absolute on the node: a script may change its folder
        exports = f'export {node_env.DATA}="$PWD"/{shlex.quote(rdzv.data_path)}\n'
    if node.transport == "ssh":  # the trainer package: a script may import fatpipe.trainer.api
        exports += f'export PYTHONPATH="$PWD/{REMOTE_PKG}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
    # Where this node's worker of local rank 0 records its group rank (trainer.noderank): torch,
    # not the node's index, decides which node is rank 0. Cleared first, as the error files are.
    grank = shlex.quote(group_rank_file(rdzv, node.rank))
    exports += f'rm -f {grank}; export {node_env.GROUP_RANK_FILE}="$PWD"/{grank}\n'
    return f"""#!/usr/bin/env bash
# fatpipe run {rdzv.run_id} on cluster {rdzv.cluster}: node {node.name}, node {node.rank} of {rdzv.nnodes}.
# Runnable by hand on that node, from the project folder: bash {rdzv.run_rel}/node-{node.rank}.sh
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # `ip` lives there on some images, outside a user's PATH
cd "$(dirname "$0")/{up}"
set -a; . "{rdzv.run_rel}/node-{node.rank}.env"; set +a
IFACE=$(ip -o -4 addr show | awk -v want="${node_env.PRIVATE_IP}" '{IFACE_AWK}')
if [ -z "$IFACE" ]; then
  echo "fatpipe: no interface on $(hostname) holds ${node_env.PRIVATE_IP}" >&2
  exit 2
fi
# NCCL reads its value as a prefix unless it starts with =; gloo takes one exact name.
export NCCL_SOCKET_IFNAME="=$IFACE" GLOO_SOCKET_IFNAME="$IFACE"
# This attempt's error files only: the ones a failure is named from (ops.run.rootcause).
rm -rf {shlex.quote(torchrun_log_dir(rdzv, node.rank))}
{exports}PY=${{FATPIPE_PYTHON:-}}; [ -n "$PY" ] || PY={shlex.quote(node.python)}
exec "$PY" {body}
"""


def _group(args: list[str]) -> list[str]:
    """Pair each `--flag` with its value; the first items are TORCHRUN's."""
    out, i = [" ".join(args[:len(TORCHRUN)])], len(TORCHRUN)
    while i < len(args):
        nxt = args[i + 1] if i + 1 < len(args) else None
        if (args[i] == "-m" or args[i].startswith("--")) and nxt is not None and not nxt.startswith("--"):
            out.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out
