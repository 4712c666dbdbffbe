"""Start a rendezvous'd run on every node, stream the per-node logs, stop it, collect exit codes.

Each node runs `bash <run>/node-<rank>.sh` detached (`setsid`), its output in
`<run>/node-<rank>.log`, the session id in `node-<rank>.pid` and torchrun's exit status in
`node-<rank>.exit`, all in the run folder on that node. So `fatpipe launch` may die and
`fatpipe logs` reattach; Ctrl-C signals every node's process group. ssh nodes get the project
folder by rsync and a venv (or a given interpreter); sim nodes share this machine's files and
interpreter.

`run_on_all_nodes` is the one call other parts use (netcheck runs its sweep through it).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import FatpipeError
from .rendezvous import (
    REMOTE_PKG,
    REMOTE_VENV,
    NodePlan,
    Rendezvous,
    plan_rendezvous,
    write_rendezvous,
)
from .transport import Transport, fan_out, transport_for

# Never shipped to nodes, on top of each folder's .gitignore.
SYNC_EXCLUDES = (
    ".git", ".venv", "venv", ".fatpipe", "cdktf.out", "__pycache__", "*.pyc", "node_modules",
    ".tools", ".pytest_cache", ".ruff_cache", "*.egg-info", "build", "dist",
)
TORCH_SPEC_ENV = "FATPIPE_TORCH"  # what the node venv installs for torch (default: this torch's version)
TORCH_INDEX_ENV = "FATPIPE_TORCH_INDEX_URL"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
LOST = 255  # the status of a node whose process vanished without writing its exit status
STOP_WAIT_S = 10  # from SIGTERM to SIGKILL: torchrun stops its workers in this time
# Once a node's torchrun has failed, the run cannot finish (the node count is fixed): its peers
# get this long to print their own errors, then they are stopped.
FAIL_GRACE_S = 10

Sink = Callable[[str, str], None]  # (node name, log line)
Log = Callable[[str], None]


@dataclass
class LaunchResult:
    """How a run ended: per-node exit codes (None: unknown) and the worst of them."""

    run_id: str
    run_dir: Path
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)  # nodes fatpipe stopped after another failed
    interrupted: bool = False
    timed_out: bool = False
    elapsed_s: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.timed_out:
            return 124
        # A node stopped because a peer failed reports the stop, not the cause: prefer the cause.
        own = [c for name, c in self.exit_codes.items() if name not in self.stopped]
        return worst_status(own) or worst_status(self.exit_codes.values())

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def worst_status(codes) -> int:
    """The status to exit with: 0 when every node passed, else the largest failure (lost = 255)."""
    codes = [LOST if c is None else int(c) for c in codes]
    failed = [c for c in codes if c != 0]
    return max(failed, key=lambda c: c if c > 0 else 128 - c) if failed else 0


class NodeRun:
    """One node's side of a run: the commands that start, watch and stop it there."""

    def __init__(self, rdzv: Rendezvous, plan: NodePlan, transport: Transport):
        self.rdzv, self.plan, self.transport = rdzv, plan, transport
        stem = f"{rdzv.run_rel}/node-{plan.rank}"
        self.script, self.log, self.pid, self.exit = (
            shlex.quote(f"{stem}.{ext}") for ext in ("sh", "log", "pid", "exit")
        )
        self.name = plan.name

    def sh(self, snippet: str) -> str:
        """`snippet` run from the project folder on the node."""
        return f"cd {shlex.quote(self.plan.workdir)} && {snippet}"

    def start_command(self) -> str:
        # The wrapper traps TERM/INT so that, when the group is signalled, it outlives torchrun
        # (which shuts its workers down) and records torchrun's status.
        inner = (
            f'echo $$ > {self.pid}; trap true TERM INT HUP; bash {self.script} > {self.log} 2>&1 < /dev/null; '
            f"echo $? > {self.exit}.tmp; mv {self.exit}.tmp {self.exit}"
        )
        return self.sh(
            f"rm -f {self.exit} {self.pid} && : > {self.log} && "
            f"setsid -f bash -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 && "
            f"for i in $(seq 100); do [ -s {self.pid} ] && exit 0; sleep 0.1; done; "
            'echo "fatpipe: the node process did not start" >&2; exit 1'
        )

    def follow_command(self, follow: bool = True) -> str:
        if not follow:
            return self.sh(f"cat {self.log}")
        # tail ends by itself once the node's process has exited (--pid), after printing the rest.
        return self.sh(f'exec tail -n +1 -s 0.5 -F --pid="$(cat {self.pid})" {self.log} 2>/dev/null')

    def status_command(self) -> str:
        return self.sh(
            f"if [ -e {self.exit} ]; then cat {self.exit}; "
            f'elif [ -s {self.pid} ] && kill -0 "$(cat {self.pid})" 2>/dev/null; then echo running; '
            f"elif [ -e {self.pid} ]; then echo lost; else echo not-started; fi"
        )

    def stop_command(self) -> str:
        descendants = (
            "ps -e -o pid=,ppid= | awk -v r=\"$pg\" '{par[$1]=$2} END {keep[r]=1; do {ch=0; "
            "for (p in par) if (!(p in keep) && (par[p] in keep)) {keep[p]=1; ch=1}} while (ch); "
            "for (p in keep) print p}'"
        )
        # TERM the group (the wrapper outlives it and records torchrun's status), give torchrun
        # STOP_WAIT_S to stop its workers, then KILL whatever of the tree is left: workers run in
        # sessions of their own, and torchrun stuck in its exit barrier ignores TERM.
        return self.sh(
            f'pg=$(cat {self.pid} 2>/dev/null) || exit 0; [ -e {self.exit} ] && exit 0; '
            f"pids=$({descendants}); kill -TERM -- -$pg 2>/dev/null; "
            f"for i in $(seq {STOP_WAIT_S * 10}); do [ -e {self.exit} ] && break; sleep 0.1; done; "
            # Zombies count as gone: nothing reaps an orphan's child quickly in some containers.
            "live() { for p in \"$@\"; do s=$(ps -o stat= -p $p 2>/dev/null); "
            "[ -n \"$s\" ] && [ \"${s#Z}\" = \"$s\" ] && echo $p; done; }; "
            "left=$(live $pids); if [ -n \"$left\" ]; then kill -KILL $left 2>/dev/null; "
            "for i in $(seq 20); do [ -z \"$(live $left)\" ] && break; sleep 0.1; done; fi; "
            f"[ -e {self.exit} ] || echo 137 > {self.exit}; exit 0"
        )

    def status(self, timeout: float = 30) -> str:
        result = self.transport.run(self.status_command(), timeout=timeout)
        return result.stdout.strip() if result.ok else f"unreachable: {result.reason()}"

    def exit_code(self) -> int | None:
        text = self.status()
        return int(text) if text.lstrip("-").isdigit() else None


def node_runs(rdzv: Rendezvous, state_dir: Path) -> list[NodeRun]:
    return [NodeRun(rdzv, plan, transport_for(plan, state_dir)) for plan in rdzv.nodes]


def run_nodes(project, cluster: str, run_id: str | None = None) -> tuple[str, Path, list[NodeRun]]:
    """(run id, run folder, its nodes) of an existing run of `cluster`, the latest by default."""
    from .rendezvous import read_rendezvous
    from .runs import find_run

    run_id, run_dir = find_run(project, cluster, run_id)
    return run_id, run_dir, node_runs(read_rendezvous(run_dir), project.state_dir(cluster))


def node_states(nodes: list[NodeRun]) -> list[str]:
    """Each node's run state (running, exited N, ...), asked of all nodes at once."""
    return fan_out(lambda n: n.status(timeout=15), nodes)


# ---- preparing ssh nodes -------------------------------------------------------------------


def torch_spec() -> str:
    """The torch requirement node venvs install: $FATPIPE_TORCH, else this machine's version."""
    if os.environ.get(TORCH_SPEC_ENV):
        return os.environ[TORCH_SPEC_ENV]
    from importlib.metadata import version

    return "torch==" + version("torch").split("+")[0]


def venv_stamp(project_root: Path, spec: str, index: str) -> str:
    """What a node venv was built from: the torch pin, the index, pyproject.toml, requirements.txt."""
    digest = hashlib.sha256(f"{spec}\n{index}\n".encode())
    for name in ("pyproject.toml", "requirements.txt"):
        path = project_root / name
        digest.update(path.read_bytes() if path.is_file() else b"-")
    return digest.hexdigest()[:16]


def venv_command(stamp: str, spec: str, index: str) -> str:
    """Make or reuse the project venv on a node; torch first, pinned, then requirements.txt."""
    py = f"{REMOTE_VENV}/bin/python"
    index_flag = f"--index-url {shlex.quote(index)} " if index else ""
    return (
        f"have=; [ -f {REMOTE_VENV}/.fatpipe-stamp ] && read -r have < {REMOTE_VENV}/.fatpipe-stamp; "
        f'[ "$have" = {stamp} ] && exit 0; set -e; '
        f"python3 -m venv {REMOTE_VENV}; {py} -m pip install -q --upgrade pip; "
        f"{py} -m pip install -q {index_flag}{shlex.quote(spec)}; "
        f"if [ -f requirements.txt ]; then {py} -m pip install -q -r requirements.txt; fi; "
        f"echo {stamp} > {REMOTE_VENV}/.fatpipe-stamp"
    )


def trainer_package_dir() -> Path:
    """The folder of the installed fatpipe.trainer (an editable install may load it as a namespace)."""
    import fatpipe.trainer

    for entry in fatpipe.trainer.__path__:
        if (Path(entry) / "__main__.py").is_file():
            return Path(entry)
    raise FatpipeError("cannot find the fatpipe.trainer package folder to ship to the nodes")


def prepare_node(project, node: NodeRun, run_dir: Path, gpus: int, log: Log) -> None:
    """Ship the project and the run folder to an ssh node and make sure its Python can run torch."""
    t, plan = node.transport, node.plan
    if t.shares_fs:
        return
    steps: list[tuple[str, Callable[[], object]]] = [
        ("copy the project folder", lambda: t.push(project.root, plan.workdir, SYNC_EXCLUDES)),
        ("copy the run folder", lambda: t.push(run_dir, f"{plan.workdir}/{node.rdzv.run_rel}", ("*.log",))),
    ]
    if node.rdzv.ships_trainer:
        trainer_dir = trainer_package_dir()
        steps.append(("copy the trainer",
                      lambda: t.push(trainer_dir, f"{plan.workdir}/{REMOTE_PKG}/fatpipe/trainer", SYNC_EXCLUDES)))
    if plan.python == f"{REMOTE_VENV}/bin/python":
        spec = torch_spec()
        index = os.environ.get(TORCH_INDEX_ENV, "" if gpus else CPU_TORCH_INDEX)
        stamp = venv_stamp(project.root, spec, index)
        steps.append(("make the venv", lambda: t.run(node.sh(venv_command(stamp, spec, index)), timeout=1800)))
    else:  # a given interpreter (an image that ships torch): only check it can
        check = f'{shlex.quote(plan.python)} -c "import torch"'
        steps.append((f"check {plan.python}", lambda: t.run(node.sh(check), timeout=120)))
    for what, step in steps:
        started = time.monotonic()
        result = step()
        if not result.ok:
            raise FatpipeError(f"{t.describe()}: {what} failed: {result.reason()}")
        log(f"{node.name}: {what} ({time.monotonic() - started:.1f} s)")


def fetch_run(node: NodeRun, run_dir: Path) -> None:
    """Bring an ssh node's run folder (logs; metrics and checkpoints on the rank-0 node) back here."""
    if not node.transport.shares_fs:
        node.transport.pull(f"{node.plan.workdir}/{node.rdzv.run_rel}", run_dir)


# ---- starting, watching, stopping ----------------------------------------------------------


def start_nodes(nodes: list[NodeRun]) -> None:
    results = fan_out(lambda n: n.transport.run(n.start_command(), timeout=60), nodes)
    failed = [f"{n.transport.describe()}: {r.reason()}" for n, r in zip(nodes, results, strict=True) if not r.ok]
    if failed:
        stop_nodes(nodes)
        raise FatpipeError("could not start the run on every node:\n  " + "\n  ".join(failed))


def stop_nodes(nodes: list[NodeRun]) -> None:
    """Signal every node's process group, wait for torchrun to wind down, kill what is left."""
    fan_out(lambda n: n.transport.run(n.stop_command(), timeout=STOP_WAIT_S + 30), nodes)


def follow_nodes(nodes: list[NodeRun], sink: Sink | None, follow: bool = True,
                 timeout_s: float | None = None, fail_grace_s: float | None = FAIL_GRACE_S,
                 stopped: list[str] | None = None) -> dict:
    """Stream every node's log to `sink` until all nodes exit; return {node: exit code}.

    When one node fails, the others get `fail_grace_s` to finish before they are stopped (their
    workers would otherwise wait in a collective, or torchrun in its exit barrier, for minutes);
    their names are appended to `stopped`. Raises TimeoutError past `timeout_s`; the caller
    stops the nodes.
    """
    codes: dict[str, int | None] = {}
    lock = threading.Lock()

    def watch(node: NodeRun) -> None:
        proc = node.transport.popen(node.follow_command(follow))
        try:
            for line in proc.stdout:
                if sink:
                    sink(node.name, line.rstrip("\n"))
        finally:
            proc.wait()
        code = node.exit_code() if follow else None
        with lock:
            codes[node.name] = code

    threads = [threading.Thread(target=watch, args=(n,), daemon=True, name=f"follow-{n.name}") for n in nodes]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s if timeout_s else None
    failed_at = None
    stopping = False
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.2)
        now = time.monotonic()
        if deadline and now > deadline:
            raise TimeoutError(f"the run did not finish within {timeout_s:g} s")
        with lock:
            bad = any(c != 0 for c in codes.values())
        if bad and failed_at is None:
            failed_at = now
        if follow and failed_at and fail_grace_s is not None and not stopping and now - failed_at > fail_grace_s:
            stopping = True
            left = [n for n in nodes if n.name not in codes]
            if stopped is not None:
                stopped.extend(n.name for n in left)
            threading.Thread(target=stop_nodes, args=(left,), daemon=True).start()
    return {n.name: codes.get(n.name) for n in nodes}


def launch(project, rdzv: Rendezvous, run_dir: Path, *, sink: Sink | None = None,
           log: Log = lambda _: None, timeout_s: float | None = None, detach: bool = False,
           gpus_per_node: int = 0, fail_grace_s: float | None = FAIL_GRACE_S) -> LaunchResult:
    """Prepare every node, start the run, stream its logs, and return how it ended.

    Ctrl-C (KeyboardInterrupt) or the timeout stops the run on every node before returning.
    """
    state_dir = project.state_dir(rdzv.cluster)
    nodes = node_runs(rdzv, state_dir)
    result = LaunchResult(rdzv.run_id, Path(run_dir))
    started = time.monotonic()
    try:
        fan_out(lambda n: prepare_node(project, n, run_dir, gpus_per_node, log), nodes)
        try:
            start_nodes(nodes)
        except KeyboardInterrupt:  # some nodes may have started already
            stop_nodes(nodes)
            raise
        log(f"started run {rdzv.run_id} on {len(nodes)} node(s)")
        if detach:
            return result
        try:
            result.exit_codes = follow_nodes(nodes, sink, timeout_s=timeout_s, fail_grace_s=fail_grace_s,
                                             stopped=result.stopped)
        except TimeoutError as e:
            log(f"{e}: stopping every node")
            result.timed_out = True
            stop_nodes(nodes)
            result.exit_codes = {n.name: n.exit_code() for n in nodes}
        except KeyboardInterrupt:
            log("interrupted: stopping every node")
            result.interrupted = True
            stop_nodes(nodes)
            result.exit_codes = {n.name: n.exit_code() for n in nodes}
        fan_out(lambda n: fetch_run(n, Path(run_dir)), nodes)
    finally:
        result.elapsed_s = time.monotonic() - started
    return result


def running_nodes(project, cluster: str) -> tuple[str, list[str]] | None:
    """(run id, nodes still running it) for the cluster's latest run, or None when nothing runs.

    A second run would collide with it on the rendezvous port and the CPUs.
    """
    try:
        run_id, _, nodes = run_nodes(project, cluster)
    except FatpipeError:
        return None
    states = node_states(nodes)
    busy = [n.name for n, state in zip(nodes, states, strict=True) if state == "running"]
    return (run_id, busy) if busy else None


def refuse_if_running(project, cluster: str) -> None:
    busy = running_nodes(project, cluster)
    if busy:
        run_id, names = busy
        raise FatpipeError(f"run {run_id} is still running on {', '.join(names)}: follow it with "
                           f"`fatpipe logs {cluster} -f` or end it with `fatpipe stop {cluster}`")


def run_on_all_nodes(project, outputs, entry: list[str] | None, *, run_id: str | None = None,
                     run_dir: Path | None = None, train_args: list[str] | None = None,
                     nproc_per_node: int | None = None, max_restarts: int = 0,
                     join_timeout_s: int = 120, timeout_s: float | None = 600,
                     remote_python: str | None = None, sink: Sink | None = None,
                     log: Log = lambda _: None) -> LaunchResult:
    """Run a torchrun entry on every node of `outputs` and wait for it: the call netcheck uses.

    `entry` is what follows torchrun's options, e.g. `["-m", "fatpipe.trainer.bench", "--sizes", "1M"]`
    or `["train.py", "--lr", "1e-3"]`; None runs the built-in trainer with `train_args`. Without
    `run_dir` a new run is made under `.fatpipe/<cluster>/runs/`; a given `run_dir` (which must lie
    inside the project folder) gets the rendezvous files, logs and exit files, and `run_id`
    (default: derived from the folder) must be unique per run. Returns a LaunchResult:
    `.exit_codes` per node, `.exit_code` the worst, `.ok`.
    """
    from .runs import new_run

    if run_dir is None:
        run_id, run_dir = new_run(project, outputs.name)
    else:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        run_id = run_id or "-".join(run_dir.resolve().parts[-2:])
    rdzv = plan_rendezvous(
        project, outputs, run_id, run_dir, entry=entry, train_args=train_args,
        nproc_per_node=nproc_per_node, max_restarts=max_restarts, join_timeout_s=join_timeout_s,
        remote_python=remote_python,
    )
    write_rendezvous(rdzv, run_dir)
    return launch(project, rdzv, run_dir, sink=sink, log=log, timeout_s=timeout_s,
                  gpus_per_node=outputs.gpus_per_node)
