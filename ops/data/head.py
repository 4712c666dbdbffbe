"""The staging chain's head on this machine: place 0, holding the source, linked to node 0 by its ssh session.

Node 0's program (`trainer.staging.stage --from-operator`) reads the chain's bytes on its standard
input and says its messages up as `chainlink.UP_PREFIX` lines (`chainlink.StdioLink`). Here the
chain runs as on every node (`stage.plan`, `chainlink.move`): what every node holds comes up, the
whole picture goes down, then the pieces that some node lacks and no node before it holds, read from
the source as the manifest lists it. So the data crosses the uplink once, with no pre-pass (the
manifest and the nodes' hashes say what is missing) and no second read on node 0 (it checks each
chunk as it lands and forwards it at once): the uplink and the private links carry the data at the
same time. docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

from fatpipe.trainer.staging.chainlink import UP_PREFIX, ChainBroke, move, recv_message, send_message
from fatpipe.trainer.staging.stage import BUFFERS, plan


class PipeLink:
    """This machine's end of node 0's `StdioLink`: bytes go into the program's standard input, and
    what it says up arrives through its output reader (`feed`, `end`)."""

    def __init__(self):
        self.stdin, self.timeout = None, None  # the program's input, once it is started
        self.up, self.ended = bytearray(), False
        self.arrived = threading.Condition()

    def feed(self, line: str) -> None:
        with self.arrived:
            self.up += base64.b64decode(line[len(UP_PREFIX):])
            self.arrived.notify_all()

    def end(self) -> None:
        """Node 0's output ended: a read now sees the link closed."""
        with self.arrived:
            self.ended = True
            self.arrived.notify_all()

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def recv_into(self, view: memoryview) -> int:
        with self.arrived:
            if not self.arrived.wait_for(lambda: self.up or self.ended, self.timeout):
                raise TimeoutError(f"node 0 said nothing within {self.timeout:.0f} s")
            n = min(len(view), len(self.up))
            view[:n] = self.up[:n]
            del self.up[:n]
            return n

    def sendall(self, data) -> None:
        self.stdin.write(data)
        self.stdin.flush()

    def close(self) -> None:
        pass


class SourceFiles:
    """The chain's `Files` at the head: pieces read from the source, never written."""

    def __init__(self, manifest: dict, source: Path):
        self.manifest, self.source = manifest, source

    def read(self, task, into: memoryview) -> None:
        name = self.manifest["files"][task.file]["name"]
        path = self.source / name if self.manifest["kind"] == "folder" else self.source
        with open(path, "rb") as f:
            f.seek(task.offset)
            if f.readinto(into) != len(into):
                raise ChainBroke(f"{path} is shorter than when it was hashed: it changed during the push")


def lead(manifest: dict, source: Path, link: PipeLink, piece_timeout: float, deadline: float) -> dict:
    """Place 0's part of the chain. Returns every node's report, in chain order, and `uplink_s`:
    how long the head took to send what it sent (None: node 0 and the rest needed nothing from it)."""
    below = recv_message(link, b"HELD", max(1.0, deadline - time.monotonic()))
    everyone = [[[True] * len(entry["chunks"]) for entry in manifest["files"]], *below]
    send_message(link, b"ALL ", everyone)
    tasks = plan(manifest, everyone, 0)
    started = time.monotonic()
    move(tasks, SourceFiles(manifest, source), None, [None, link], lambda _received: None, piece_timeout, BUFFERS)
    uplink_s = time.monotonic() - started if tasks else None
    nodes = recv_message(link, b"REPT", max(1.0, deadline - time.monotonic()))
    return {"fingerprint": manifest["fingerprint"], "nodes": nodes, "uplink_s": uplink_s}


class Head:
    """`lead` in a thread of its own beside the nodes' programs. Its failure closes node 0's input,
    which ends node 0's program and so the chain; `error` says why."""

    def __init__(self, manifest: dict, source: Path, piece_timeout: float, deadline: float):
        self.args = (manifest, source)
        self.piece_timeout, self.deadline = piece_timeout, deadline
        self.report: dict | None = None
        self.error: str | None = None
        self.thread: threading.Thread | None = None

    def start(self, link: PipeLink, stop) -> None:
        def run() -> None:
            try:
                self.report = lead(*self.args, link, self.piece_timeout, self.deadline)
            except Exception as e:  # noqa: BLE001 - any failure here is said, and ends the chain
                self.error = str(e) or type(e).__name__
                stop()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=60)
