"""The fan-out of a local source: every node runs the staging chain at once, over plain sockets.

Each node gets one command: its system Python (no venv, no torch) running
`fatpipe.trainer.staging.stage` as sent (`nodeprogram`), told its place in the chain, the private
address and port it listens on and the next node's, and the push's token on its standard input,
which stays open: when this machine stops (Ctrl-C, a failed node) the inputs close and every node's
program ends. The port is the cluster's rendezvous port + STAGE_PORT_OFFSET, which the firewall
opens between members alone (docs/ARCHITECTURE.md, "The data contract").
"""

from __future__ import annotations

import io
import json
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.node.env import NODE_NAME
from fatpipe.trainer.staging.chainlink import TOKEN_ENV, UP_PREFIX
from fatpipe.trainer.staging.stage import PROGRESS_PREFIX, RESULT_PREFIX

from ..reach.cluster import Cluster
from .check import MANIFEST_DIR, node_workdir
from .head import Head, PipeLink
from .nodeprogram import boot_command, program_line

STAGE_PORT_OFFSET = 2  # rdzv_port + 1 is netcheck's point-to-point port
STARTUP_ALLOWANCE_S = 60
UPLINK_TIMEOUT_S = 24 * 3600
CHAIN_MANIFEST = f"{MANIFEST_DIR}/chain-manifest.json"

Log = Callable[[str], None]
Progress = Callable[[int, int], None]  # (bytes moved over the private links, bytes to move)


def chain_argv(outputs, i: int, timeout_s: float) -> list[str]:
    """Node i's arguments: its place (the head, this machine, is place 0), where it listens (node 0:
    on its standard input, from the head), where the next node listens."""
    nodes, port = outputs.nodes, outputs.rdzv_port + STAGE_PORT_OFFSET
    argv = ["--manifest", CHAIN_MANIFEST, "--place", str(i + 1), "--nodes", str(len(nodes) + 1), "--name",
            nodes[i].name, "--timeout-s", str(timeout_s)]
    argv += ["--listen", f"{nodes[i].private_ip}:{port}"] if i > 0 else ["--from-operator"]
    if i + 1 < len(nodes):
        argv += ["--next", f"{nodes[i + 1].private_ip}:{port}"]
    return argv


class NodeChain:
    """A node program on one node (the chain's, or the quick link check's), its output read line by line.

    Its standard input is binary: after the program's line, the chain's head sends node 0 the data
    on it (`head.PipeLink` writes to `stdin`); `ended` is called once its output ends."""

    def __init__(self, t, workdir: str, python: str, line: str, sink: Callable[[str, str], None],
                 ended: Callable[[], None] | None = None):
        self.node, self.tail = t.node_name, []
        self.proc = subprocess.Popen(t.argv(f"cd {shlex.quote(workdir)} && {boot_command(python)}"),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.stdin = self.proc.stdin
        try:
            self.stdin.write(line.encode())
            self.stdin.flush()  # and kept open: its end is the program's end
        except OSError:
            pass  # ssh ended at once: its exit status and last line say why (wait_chain)
        self.reader = threading.Thread(target=self._read, args=(sink, ended), daemon=True)
        self.reader.start()

    def _read(self, sink, ended) -> None:
        for line in io.TextIOWrapper(self.proc.stdout, errors="replace"):
            line = line.rstrip("\n")
            if line.strip() and not line.startswith((RESULT_PREFIX, PROGRESS_PREFIX, UP_PREFIX)):
                self.tail = [*self.tail[-4:], line]
            sink(self.node, line)
        if ended:
            ended()

    def stop_input(self) -> None:
        try:
            self.stdin.close()  # the node's program ends with its input
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.stop_input()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(timeout=60)
        self.reader.join(timeout=60)

    def why(self) -> str:
        return self.tail[-1] if self.tail else f"exit status {self.proc.returncode}"


def fan_out_chain(cluster: Cluster, manifest: dict, source: Path, remote_python: str | None,
                  progress: Progress | None, uplink: bool) -> dict:
    """Run the chain on every node at once, headed by this machine (`head.lead`, reading `source`);
    returns every node's report in chain order and the uplink's seconds. `uplink`: node 0 lacks
    something, so the whole may take as long as the operator's uplink needs."""
    outputs, log = cluster.outputs, cluster.log
    moved: dict[str, tuple[int, int]] = {}
    lock = threading.Lock()
    link = PipeLink()

    def catch(node: str, line: str) -> None:
        with lock:
            if line.startswith(UP_PREFIX) and node == outputs.nodes[0].name:
                link.feed(line)
            elif line.startswith(PROGRESS_PREFIX):
                _place, done, total = (int(x) for x in line[len(PROGRESS_PREFIX):].split())
                moved[node] = (done, total)
                if progress:
                    progress(sum(d for d, _ in moved.values()), sum(t for _, t in moved.values()))
            elif line.strip() and not line.startswith(UP_PREFIX):
                log(f"{node}: {line}")

    link_s = manifest["total_bytes"] * 8 / (outputs.tier_gbps * 1e9)
    piece_s = STARTUP_ALLOWANCE_S + 2 * len(outputs.nodes) * manifest["chunk_size"] * 8 / 1e8
    timeout = piece_s + 4 * link_s + (UPLINK_TIMEOUT_S if uplink else 0)
    log(f"fan-out: this machine and {len(outputs.nodes)} node(s) in a chain, " +
        ("node 0 forwarding what the uplink brings as it lands" if uplink else
         f"over the private links, up to {timeout:.0f} s"))
    token = secrets.token_hex(16)
    files = {CHAIN_MANIFEST: json.dumps(manifest)}
    chain: list[NodeChain] = []
    head = Head(manifest, source, piece_s, time.monotonic() + timeout)
    try:
        for i, (node, t) in enumerate(zip(outputs.nodes, cluster.transports(), strict=True)):
            # Node 0 reads the head's bytes on its input, so its input is no watch (its end still ends it).
            line = program_line("fatpipe.trainer.staging.stage", chain_argv(outputs, i, piece_s),
                                files, {TOKEN_ENV: token, NODE_NAME: node.name}, watch=i > 0)
            chain.append(NodeChain(t, node_workdir(outputs, node), remote_python or "python3", line, catch,
                                   ended=None if i else link.end))
            if i == 0:
                link.stdin = chain[0].stdin
                head.start(link, stop=chain[0].stop_input)
        failed = wait_chain(chain, timeout)
    finally:
        for node in chain:
            node.stop()
        head.join()
    problems = [f"{n['node']}: {n['problem']}" for n in (head.report or {}).get("nodes", []) if n.get("problem")]
    if head.error or failed or problems or head.report is None:
        # A node's own failure first; then this machine's (node 0 then only says the chain broke).
        own = failed if failed and "staging chain broke" not in failed.why() else None
        why = "; ".join(problems) or (own and f"{own.node}: {own.why()}") or \
            (head.error and f"this machine: {head.error}") or (failed and f"{failed.node}: {failed.why()}") or \
            "the chain's head heard no report"
        raise FatpipeError(f"data fan-out failed: {why} (run the push again: it resumes)", exit_code=1)
    return head.report


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
