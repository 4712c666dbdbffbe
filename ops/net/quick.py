"""`netcheck --quick` without torch: every node runs `fatpipe.trainer.net.quick` at once, a
standard-library program sent with the command (`ops.data.nodeprogram`), over a ring of plain TCP
sockets between the private addresses (docs/netcheck.md, "The quick check").

No venv, no torchrun, no process group: the check costs each node one Python start and the
seconds it measures, where a torchrun job paid torch's start twice per `up` (the check's job and
the training's). Node i's end of the ring listens on the rendezvous port + RUN_PORTS_PER_NODE x i
+ 2 (`ring_port`: nodes that share an address keep apart) and node 0's point-to-point server on
+ 1: ports the firewall opens between members alone.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from fatpipe.infra.defaults import RUN_PORTS_PER_NODE
from fatpipe.infra.errors import FatpipeError
from fatpipe.trainer.net.quick import RESULT_PREFIX, TOKEN_ENV

from ..data.chain import NodeChain, wait_chain
from ..data.nodeprogram import NETCHECK, program_line
from ..reach.cluster import Cluster
from .options import NetcheckOptions

QUICK_MAIN = "fatpipe.trainer.net.quick"
STARTUP_ALLOWANCE_S = 60  # an ssh session and a Python start per node, the ring's connections


def endpoint(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def ring_port(outputs, i: int) -> int:
    return outputs.rdzv_port + RUN_PORTS_PER_NODE * i + 2


def quick_argv(outputs, i: int, options: NetcheckOptions, timeout_s: float) -> list[str]:
    """Node i's arguments: its place, where it listens, where the next node listens, what to measure."""
    nodes, following = outputs.nodes, (i + 1) % len(outputs.nodes)
    size = options.sizes(len(nodes), outputs.tier_gbps)[1]
    return ["--place", str(i), "--nodes", str(len(nodes)), "--name", nodes[i].name,
            "--listen", endpoint(nodes[i].private_ip, ring_port(outputs, i)),
            "--next", endpoint(nodes[following].private_ip, ring_port(outputs, following)),
            "--size", str(size), "--p2p-port", str(options.p2p_port or outputs.rdzv_port + 1),
            "--p2p-tool", options.p2p_tool, "--p2p-seconds", f"{options.seconds_per_p2p:g}",
            "--streams", str(options.streams), "--timeout-s", f"{timeout_s:g}"]


def quick_timeout_s(options: NetcheckOptions, nnodes: int, tier_gbps: float) -> float:
    """A generous bound: start-up, the all-reduces at a tenth of the tier, each node's p2p turn."""
    size = options.sizes(nnodes, tier_gbps)[1]
    moved = 20 * size * 2 * (nnodes - 1) / nnodes  # the check, warm-up and timed ones, with room
    return STARTUP_ALLOWANCE_S + moved * 8 / (0.1 * tier_gbps * 1e9) + (nnodes - 1) * (options.seconds_per_p2p + 15)


def run_quick(cluster: Cluster, bench_dir: Path, options: NetcheckOptions, sink=None,
              remote_python: str | None = None) -> dict:
    """Run the quick check on every node at once; node 0's result (netbench's shape). Each node's
    lines go to `bench_dir/node-<i>.log` and to `sink`."""
    outputs, log = cluster.outputs, cluster.log
    if len(outputs.nodes) < 2:
        raise FatpipeError("netcheck --quick needs two nodes or more: one node has no link to measure")
    timeout = options.timeout_s or quick_timeout_s(options, len(outputs.nodes), outputs.tier_gbps)
    log(f"netcheck: {len(outputs.nodes)} nodes at {outputs.tier_gbps:g} Gbit/s, quick (no torch), "
        f"up to {timeout:.0f} s")
    found: list[dict] = []
    logs = {node.name: (bench_dir / f"node-{i}.log").open("w") for i, node in enumerate(outputs.nodes)}

    def catch(node: str, line: str) -> None:
        if line.startswith(RESULT_PREFIX):
            found.append(json.loads(line[len(RESULT_PREFIX):]))
            return
        logs[node].write(line + "\n")
        if sink:
            sink(node, line)

    token = secrets.token_hex(16)
    programs: list[NodeChain] = []
    try:
        for i, t in enumerate(cluster.transports()):
            line = program_line(QUICK_MAIN, quick_argv(outputs, i, options, timeout), env={TOKEN_ENV: token},
                                watch=True, sent_paths=NETCHECK)
            programs.append(NodeChain(t, ".", remote_python or "python3", line, catch))
        failed = wait_chain(programs, timeout, broke="ring broke",
                            late="netcheck's quick check timed out after {timeout:.0f} s")
    finally:
        for program in programs:
            program.stop()
        for f in logs.values():
            f.close()
    if failed or not found:
        why = f"{failed.node}: {failed.why()}" if failed else "node 0 reported nothing"
        raise FatpipeError(f"netcheck's quick check failed: {why}; node logs in {bench_dir}/node-<i>.log")
    return found[-1]
