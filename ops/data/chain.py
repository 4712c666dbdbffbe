"""The fan-out of a local source: every node runs the staging chain at once, over plain sockets.

Each node gets one command: its system Python (no venv, no torch) running
`fatpipe.trainer.staging.stage` as sent (`nodeprogram`), told its place in the chain, the private
address and port it listens on and the next node's, and the push's token on its standard input,
which stays open: when this machine stops (Ctrl-C, a failed node) the inputs close and every node's
program ends. The port is the cluster's rendezvous port + STAGE_PORT_OFFSET, which the firewall
opens between members alone (docs/ARCHITECTURE.md, "The data contract").
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Callable

from fatpipe.infra.errors import FatpipeError
from fatpipe.node.env import NODE_NAME
from fatpipe.trainer.staging.chainlink import TOKEN_ENV
from fatpipe.trainer.staging.stage import PROGRESS_PREFIX, RESULT_PREFIX

from ..reach.cluster import Cluster
from .check import MANIFEST_DIR, node_workdir
from .nodeprogram import boot_command, program_line

STAGE_PORT_OFFSET = 2  # rdzv_port + 1 is netcheck's point-to-point port
STARTUP_ALLOWANCE_S = 60
UPLINK_TIMEOUT_S = 24 * 3600
CHAIN_MANIFEST = f"{MANIFEST_DIR}/chain-manifest.json"

Log = Callable[[str], None]
Progress = Callable[[int, int], None]  # (bytes moved over the private links, bytes to move)


def chain_argv(outputs, i: int, timeout_s: float, source_ready: str | None) -> list[str]:
    """Node i's arguments: its place, where it listens, where the next node listens."""
    nodes, port = outputs.nodes, outputs.rdzv_port + STAGE_PORT_OFFSET
    argv = ["--manifest", CHAIN_MANIFEST, "--place", str(i), "--nodes", str(len(nodes)), "--name", nodes[i].name,
            "--timeout-s", str(timeout_s)]
    if i > 0:
        argv += ["--listen", f"{nodes[i].private_ip}:{port}"]
    if i + 1 < len(nodes):
        argv += ["--next", f"{nodes[i + 1].private_ip}:{port}"]
    if source_ready and i == 0:
        argv += ["--source-ready", source_ready, "--wait-s", str(UPLINK_TIMEOUT_S)]
    return argv


class NodeChain:
    """A node program on one node (the chain's, or the quick link check's), its output read line by line."""

    def __init__(self, t, workdir: str, python: str, line: str, sink: Callable[[str, str], None]):
        self.node, self.tail = t.node_name, []
        self.proc = subprocess.Popen(t.argv(f"cd {shlex.quote(workdir)} && {boot_command(python)}"),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, errors="replace", start_new_session=True)
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()  # and kept open: its end is the program's end
        except OSError:
            pass  # ssh ended at once: its exit status and last line say why (wait_chain)
        self.reader = threading.Thread(target=self._read, args=(sink,), daemon=True)
        self.reader.start()

    def _read(self, sink) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line.strip() and not line.startswith((RESULT_PREFIX, PROGRESS_PREFIX)):
                self.tail = [*self.tail[-4:], line]
            sink(self.node, line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the node's program ends with its input
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(timeout=60)
        self.reader.join(timeout=60)

    def why(self) -> str:
        return self.tail[-1] if self.tail else f"exit status {self.proc.returncode}"


def fan_out_chain(cluster: Cluster, manifest: dict, remote_python: str | None,
                  progress: Progress | None, source_ready: str | None = None) -> dict:
    """Run the chain on every node at once; returns place 0's report of every node.

    With `source_ready` (a path in node 0's project folder), node 0 first waits for the uplink copy's word."""
    outputs, log = cluster.outputs, cluster.log
    found: list[dict] = []
    moved: dict[str, tuple[int, int]] = {}
    lock = threading.Lock()

    def catch(node: str, line: str) -> None:
        with lock:
            if line.startswith(RESULT_PREFIX):
                found.append(json.loads(line[len(RESULT_PREFIX):]))
            elif line.startswith(PROGRESS_PREFIX):
                _place, done, total = (int(x) for x in line[len(PROGRESS_PREFIX):].split())
                moved[node] = (done, total)
                if progress:
                    progress(sum(d for d, _ in moved.values()), sum(t for _, t in moved.values()))
            elif line.strip():
                log(f"{node}: {line}")

    link_s = manifest["total_bytes"] * 8 / (outputs.tier_gbps * 1e9)
    piece_s = STARTUP_ALLOWANCE_S + 2 * len(outputs.nodes) * manifest["chunk_size"] * 8 / 1e8
    timeout = piece_s + 4 * link_s + (UPLINK_TIMEOUT_S if source_ready else 0)
    log(f"fan-out: {len(outputs.nodes)} nodes in a chain over the private links, up to {piece_s + 4 * link_s:.0f} s"
        + (" after the uplink copy" if source_ready else ""))
    token = secrets.token_hex(16)
    files = {CHAIN_MANIFEST: json.dumps(manifest)}
    transports = cluster.transports()
    chain: list[NodeChain] = []
    try:
        for i, (node, t) in enumerate(zip(outputs.nodes, transports, strict=True)):
            line = program_line("fatpipe.trainer.staging.stage", chain_argv(outputs, i, piece_s, source_ready),
                                files, {TOKEN_ENV: token, NODE_NAME: node.name}, watch=True)
            chain.append(NodeChain(t, node_workdir(outputs, node), remote_python or "python3", line, catch))
        failed = wait_chain(chain, timeout)
    finally:
        for node in chain:
            node.stop()
    report = found[-1] if found else None
    problems = [f"{n['node']}: {n['problem']}" for n in (report or {}).get("nodes", []) if n.get("problem")]
    if failed or problems or report is None:
        why = "; ".join(problems) or (f"{failed.node}: {failed.why()}" if failed else "place 0 reported nothing")
        raise FatpipeError(f"data fan-out failed: {why} (run the push again: it resumes)", exit_code=1)
    return report


def wait_chain(chain: list[NodeChain], timeout: float, broke: str = "staging chain broke",
               late: str = "data fan-out timed out after {timeout:.0f} s (run the push again: it resumes)",
               ) -> NodeChain | None:
    """Wait for every node's program; the first one that failed (the others are stopped then), not
    one that only says `broke` (its neighbour failed) while another says more. `late`: the error
    past `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [node.proc.poll() for node in chain]
        bad = [node for node, code in zip(chain, codes, strict=True) if code not in (None, 0)]
        if bad:
            time.sleep(0.5)  # its neighbours end too, saying the chain broke: name the node that did not
            bad = [node for node in chain if node.proc.poll() not in (None, 0)]
            for node in bad:
                node.reader.join(timeout=10)
            return next((node for node in bad if broke not in node.why()), bad[0])
        if all(code == 0 for code in codes):
            return None
        if time.monotonic() > deadline:
            raise FatpipeError(late.format(timeout=timeout))
        time.sleep(0.05)
