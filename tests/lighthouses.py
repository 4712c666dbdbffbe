"""Live runs on this machine for the tests: torchft's Lighthouse and one torchrun per "node",
all on loopback, as the launch path starts them on a cluster (one replica group per node)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

TRAIN = ["--preset", "tiny", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "3",
         "--eval-windows", "8", "--fault-tolerance", "live"]


_STARTED: list[subprocess.Popen] = []


def stop_all() -> None:
    """Kill every Lighthouse and node this module started (their whole process trees)."""
    for proc in _STARTED:
        if proc.poll() is None:
            for p in [*psutil.Process(proc.pid).children(True), psutil.Process(proc.pid)]:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            proc.wait()
    _STARTED.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lighthouse(log: Path, port: int | None = None, heartbeat_ms: int = 3000,
                     join_ms: int = 10000, min_replicas: int = 1) -> tuple[subprocess.Popen, int]:
    """The Lighthouse on 127.0.0.1; (its process, its port) once it serves."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fatpipe.trainer.live.lighthouse", "--host", "127.0.0.1",
         "--port", str(port), "--heartbeat-timeout-ms", str(heartbeat_ms),
         "--join-timeout-ms", str(join_ms), "--min-replicas", str(min_replicas)],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    _STARTED.append(proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        assert proc.poll() is None, log.read_text()
        time.sleep(0.2)
    raise AssertionError(f"the Lighthouse did not serve on {port}: {log.read_text()}")


def start_node_lighthouse(log: Path, relay_port: int, lighthouse_ports: list[int],
                          port: int | None = None, min_replicas: int = 1) -> subprocess.Popen:
    """A node's `trainer.live.lighthouse` as the launch starts it, on 127.0.0.1: its relay on
    `relay_port` to the run's Lighthouses (in order), and its own Lighthouse on `port` if given;
    its process once the relay takes connections."""
    args = ["--relay-port", str(relay_port),
            "--lighthouses", ",".join(f"127.0.0.1:{p}" for p in lighthouse_ports)]
    if port is not None:
        args += ["--host", "127.0.0.1", "--port", str(port), "--min-replicas", str(min_replicas)]
    proc = subprocess.Popen([sys.executable, "-m", "fatpipe.trainer.live.lighthouse", *args],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    _STARTED.append(proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", relay_port)) == 0:
                return proc
        assert proc.poll() is None, log.read_text()
        time.sleep(0.2)
    raise AssertionError(f"the relay did not serve on {relay_port}: {log.read_text()}")


class LiveNode:
    """One node of a live run: `torchrun --nnodes 1` of the built-in trainer, its own run folder."""

    def __init__(self, root: Path, rank: int, nodes: int, lighthouse_port: int, args: list[str],
                 nproc: int = 1, script: Path | None = None):
        """`script`: a user's script through fatpipe.trainer.api instead, `args` its [train]."""
        self.root, self.rank, self.nodes = root, rank, nodes
        self.lighthouse_port, self.args, self.nproc = lighthouse_port, args, nproc
        self.script = script
        self.run = root / "run"  # shared, as the sim's nodes share a disk
        self.out = self.run if rank == 0 else self.run / f"live-node-{rank}"
        self.log = root / f"node{rank}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "FATPIPE_LIVE_LIGHTHOUSE": f"127.0.0.1:{self.lighthouse_port}",
               "FATPIPE_PRIVATE_IP": "127.0.0.1", "FATPIPE_NODE_NAME": f"live-{self.rank}",
               "FATPIPE_NODE_RANK": str(self.rank), "FATPIPE_NODES": str(self.nodes),
               "OMP_NUM_THREADS": "1"}
        entry = ["-m", "fatpipe.trainer", *TRAIN, *self.args, "--out", str(self.run)]
        if self.script:  # as the launch path runs a script (ops.rdzv.rendezvous)
            entry = ["-m", "fatpipe.trainer.api.userscript", str(self.script)]
            env |= {"FATPIPE_RUN_DIR": str(self.run),
                    "FATPIPE_TRAIN_ARGS": " ".join(["--fault-tolerance", "live", *self.args])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
             "--nproc-per-node", str(self.nproc), "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{free_port()}", *entry],
            env=env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
            start_new_session=True)
        _STARTED.append(self.proc)

    def kill(self) -> float:
        """SIGKILL to the agent and every worker at once (a node lost); the time it happened."""
        procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(True)]
        for p in procs:
            p.send_signal(signal.SIGKILL)
        killed = time.time()
        self.proc.wait()
        return killed

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"node {self.rank} did not end in {timeout} s:\n"
                                 f"{self.log.read_text()[-4000:]}") from None

    def metrics(self) -> list[dict]:
        path = self.out / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def last_step(self) -> int:
        return max((r["step"] for r in self.metrics()), default=0)

    def summary(self) -> dict:
        return json.loads((self.out / "summary.json").read_text())

    def wait_step(self, step: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.last_step() < step:
            assert time.monotonic() < deadline, (f"node {self.rank} not at step {step} in "
                                                 f"{timeout} s:\n{self.log.read_text()[-4000:]}")
            assert self.proc.poll() is None, self.log.read_text()[-4000:]
            time.sleep(0.3)


def replica_manager(name: str, rank: int, lighthouse_port: int, state: dict):
    """A replica group's Manager on loopback (in a process of its own: `run_replicas`), with its
    own store; `state` ({"w": tensor}) is what it sends and receives. Returns (manager, store)."""
    from datetime import timedelta

    import torch.distributed as dist

    from fatpipe.trainer.live.manager import LiveSettings, live_manager

    store_port = free_port()
    store = dist.TCPStore("127.0.0.1", store_port, is_master=True,
                          timeout=timedelta(seconds=30), wait_for_workers=False)
    settings = LiveSettings(lighthouse=f"127.0.0.1:{lighthouse_port}", private_ip="127.0.0.1",
                            replica_id=f"{name}-{rank}", store_port=store_port, nodes=3,
                            node_rank=rank)
    manager = live_manager(settings, lambda: dict(state),
                           lambda sd: state.update(w=sd["w"].clone()), 0, 1)
    return manager, store


def run_replicas(log: Path, target, args: list[tuple], timeout_s: float = 150) -> list:
    """`target(*args[i], queue)` in a spawned process per replica, beside a Lighthouse that waits
    for all of them; what each put on the queue, sorted. Stragglers are killed."""
    import multiprocessing as mp

    _lh, port = start_lighthouse(log, min_replicas=len(args))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, port, out)) for a in args]
    try:
        for p in procs:
            p.start()
        results = sorted(out.get(timeout=timeout_s) for _ in procs)
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():  # a replica stuck in a collective that did not match
                p.kill()
        stop_all()
    return results


def end_replica(manager, out) -> None:
    """A replica process's end, once it has put its result on `out`."""
    manager.shutdown(wait=False)
    out.close()
    out.join_thread()  # the queue's feeder has sent the result
    os._exit(0)  # torchft's threads would hold the interpreter
