"""One node's side of a run: the commands that start, watch and stop it there, and how it ended.

Each node's supervisor (supervisor.py, a Python program in a session of its own) runs
`bash <run>/node-<rank>.sh` through a keeper per attempt, its output in `<run>/node-<rank>.log`,
the supervisor's pid (its session id) in `node-<rank>.pid` (who that process is, its boot and
start time, in `node-<rank>.ident`: `runproc`), the attempt's keeper and status in
`node-<rank>.keeper` and torchrun's last exit status in `node-<rank>.exit`, all in the run folder
on that node. So `fatpipe launch` may die and `fatpipe logs` reattach.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fatpipe.infra.node import REMOTE_PKG
from fatpipe.node import source_file

from ..reach.asknode import NodeCallError, Step, answer_of, ask
from ..reach.cluster import Cluster
from ..reach.transport import Transport, fan_out
from .nodefiles import group_rank_file, lighthouse_args
from .rendezvous import NodePlan, Rendezvous, read_rendezvous

LIGHTHOUSE_MODULE = "fatpipe.trainer.live.lighthouse"

LOST = 255  # the status of a node whose process vanished without writing its exit status
# fatpipe stopped following a run whose node stayed out of reach: the run goes on on its nodes
# (sysexits' EX_TEMPFAIL: try again later, with `fatpipe logs -f`).
UNFOLLOWED = 75
STOP_WAIT_S = 10  # from SIGTERM to SIGKILL: torchrun stops its workers in this time
# Checks a run's process and stops it on the node: node/runproc.py, standard library only.
RUNPROC_FILE = source_file("runproc")
RUNPROC = RUNPROC_FILE.read_text()
RUNPROC_SOURCE = (("runproc", RUNPROC_FILE),)
# The node's supervisor (supervisor.py), runproc loaded first as the module it imports.
SUPERVISOR = (
    "import sys, types\nrunproc = sys.modules['runproc'] = types.ModuleType('runproc')\n"
    f"exec(compile({RUNPROC!r}, 'runproc.py', 'exec'), runproc.__dict__)\n"
    f"{source_file('supervisor').read_text()}\nsys.exit(main(sys.argv[1:]))\n")
# torch 2.13: a torchrun that joins a running job (a new agent, in a later rendezvous round) waits
# for the address of the store the workers share, which node 0's agent writes under the round's
# key prefix only in its own first round; the new agent blocked until its read timeout. This copies
# that address into the next rounds' prefixes (never over a value already there) before a
# restarted torchrun starts. Arguments: rendezvous host, port, rendezvous id.
REJOIN_ROUNDS = 64
REJOIN_PY = f"""
import datetime, sys
import torch.distributed as dist
host, port, rid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
key = lambda r, k: f"torch.rendezvous.{{rid}}.{{r}}/{{k}}"
first = next((r for r in range({REJOIN_ROUNDS}) if store.check([key(r, "MASTER_ADDR")])), None)
if first is not None:
    for k in ("MASTER_ADDR", "MASTER_PORT"):
        value = store.get(key(first, k))
        for r in range(first + 1, first + {REJOIN_ROUNDS}):
            store.compare_set(key(r, k), "", value)
"""
REJOIN_TIMEOUT_S = 60
Sink = Callable[[str, str], None]  # (node name, log line)
Log = Callable[[str], None]


@dataclass
class LaunchResult:
    """How a run ended: per-node exit codes (None: unknown) and the worst of them."""

    run_id: str
    run_dir: Path
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)  # nodes fatpipe stopped after another failed
    # Nodes whose end is not known because the follow gave up: {node: "unreachable" | "running"}.
    unknown: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False
    timed_out: bool = False
    elapsed_s: float = 0.0
    failure: str | None = None  # why it failed, in one line naming the node and the phase
    live: bool = False  # fault_tolerance = "live": the run needs only the nodes that stayed
    # Live: nodes out of reach that the others went on without, {node: {"step", "time"}} (ops.run.liveleave).
    left: dict[str, dict] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.timed_out:
            return 124
        if self.live and 0 in self.exit_codes.values():
            return live_status(self.exit_codes.values())
        # A node stopped because a peer failed reports the stop, not the cause: prefer the cause.
        own = [c for name, c in self.exit_codes.items() if name not in self.stopped]
        if self.unknown:  # a failure already recorded says more than "still going"
            return worst_status(own) or UNFOLLOWED
        return worst_status(own) or worst_status(self.exit_codes.values())

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def ridden_out(code: int | None) -> bool:
    """Under live: a node's end that the run rode out, lost (None) or ended by a signal after
    its restarts; a node that failed on its own (an error status below 128) is no such end."""
    return code is None or not 0 <= code < 128


def live_status(codes) -> int:
    """A live run's status once a node finished it: the worst end not ridden out."""
    return worst_status(c for c in codes if not ridden_out(c))


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
        self.log, self.pid, self.exit, self.stop, self.ident, self.keeper = (
            shlex.quote(f"{stem}.{ext}") for ext in ("log", "pid", "exit", "stop", "ident", "keeper"))
        self.name = plan.name

    def sh(self, snippet: str) -> str:
        """`snippet` run from the project folder on the node."""
        return f"cd {shlex.quote(self.plan.workdir)} && {snippet}"

    def start_command(self) -> str:
        """Starts the node's supervisor (supervisor.py) from the project folder: Python given its
        settings as one JSON argument, so no value of the run's is shell text there."""
        settings = shlex.quote(json.dumps(self.settings()))
        return self.sh(f"python3 -c {shlex.quote(SUPERVISOR)} start {settings}")

    def settings(self) -> dict:
        """What the node's supervisor needs: its files, the restart policy, the interpreter, the
        rendezvous step before a restart and, under live, the node's Lighthouse.

        A torchrun killed by a signal that `fatpipe stop` did not send is started again, up to
        max_restarts times (supervisor.py). Node 0's is not: it hosts the rendezvous store, which
        died with it. Nor is the one torch made group rank 0 (`leads`: its record says 0). Under
        live every node hosts its own store and rejoins through the Lighthouse, not torch's
        rendezvous: any node's is started again, with no rendezvous to prepare.
        """
        rdzv, plan = self.rdzv, self.plan
        live = rdzv.live
        host, _, port = rdzv.rdzv_endpoint.rpartition(":")
        files = {name: f"{rdzv.run_rel}/node-{plan.rank}.{ext}" for name, ext in (
            ("script", "sh"), ("log", "log"), ("pid", "pid"), ("exit", "exit"), ("stop", "stop"),
            ("earlier", "earlier.log"), ("ident", "ident"), ("keeper", "keeper"))}
        return {
            "files": files, "name": plan.name, "python": plan.python,
            "restarts": rdzv.max_restarts if live or plan.rank != 0 else 0,
            "leads": None if live else group_rank_file(rdzv, plan.rank),
            "rejoin": None if live else [REJOIN_PY, host, port, rdzv.run_id],
            "rejoin_timeout_s": REJOIN_TIMEOUT_S,
            # The node's relay to the run's serving Lighthouse, and its own Lighthouse where the
            # run has one per node (trainer.live.lighthouse): `python -m` these.
            "lighthouse": [LIGHTHOUSE_MODULE, *lighthouse_args(rdzv, plan.rank)] if live else None,
            "lighthouse_path": REMOTE_PKG if live and plan.transport == "ssh" else None,
        }

    def follow_command(self, follow: bool = True, offset: int = 0) -> str:
        """The node's log from byte `offset` on: to its end, or (`follow`) until its process has
        exited (tail --pid), after printing the rest; a follower that lost its connection
        resumes where it was."""
        start = f"-c +{int(offset) + 1}"
        rest = f"if [ -e {self.log} ]; then exec tail {start} {self.log}; fi"  # a log not there adds nothing
        if not follow:
            return self.sh(rest)
        # tail waits on the wrapper's pid only while it is the run's (a reused pid is a stranger's).
        pid = self._runproc("pid", self.pid, self.ident, self.keeper)
        return self.sh(f'p=$({pid}); if [ -n "$p" ]; then '
                       f'exec tail {start} -s 0.5 -F --pid="$p" {self.log} 2>/dev/null; fi; {rest}')

    def status_command(self) -> str:
        """Prints the node's exit status, running, lost (its process is gone, or its pid is
        another process's now) or not-started."""
        return self.sh(self._runproc("status", self.pid, self.ident, self.exit, self.keeper))

    def stop_command(self) -> str:
        """Stops the run's processes on the node, and nothing else (`runproc.stop`)."""
        return self.sh(self._runproc("stop", self.pid, self.ident, self.exit, self.stop,
                                     str(STOP_WAIT_S), self.keeper))

    def _runproc(self, action: str, *quoted: str) -> str:
        """`runproc` on the node with `action` and its arguments (already quoted)."""
        return f"python3 -c {shlex.quote(RUNPROC)} {action} {' '.join(quoted)}"

    def status_step(self) -> Step:
        """The node program's step that answers the run's state on the node (`runproc.status`)."""
        return Step("runproc.status", self._files("pid", "ident", "exit", "keeper"), self.plan.workdir,
                    RUNPROC_SOURCE)

    def stop_step(self) -> Step:
        """The node program's step that stops the run's processes there, and nothing else."""
        return Step("runproc.stop", (*self._files("pid", "ident", "exit", "stop"), STOP_WAIT_S,
                                     *self._files("keeper")), self.plan.workdir, RUNPROC_SOURCE)

    def log_step(self, offset: int = 0) -> Step:
        """The node program's step that reads the node's log from byte `offset` (None: no log yet)."""
        return Step("read_from", (*self._files("log"), int(offset)), self.plan.workdir)

    def _files(self, *exts: str) -> tuple[str, ...]:
        return tuple(f"{self.rdzv.run_rel}/node-{self.plan.rank}.{ext}" for ext in exts)

    def status(self, timeout: float = 30) -> str:
        try:
            return state_of(answer_of(self.transport, self.status_step(), timeout))
        except NodeCallError as e:
            return f"unreachable: {e.reason}"

    def end_and_rest(self, offset: int, timeout: float = 30) -> tuple[str, str | None]:
        """The run's state on the node and its log from byte `offset` on, in one round trip:
        (state, the rest: "" when there is no log, None when it could not be read)."""
        try:
            state, rest = ask(self.transport, [self.status_step(), self.log_step(offset)], timeout)
        except NodeCallError as e:
            return f"unreachable: {e.reason}", None
        return state_of(state), None if "error" in rest else rest.get("ok") or ""

    def stop_and_status(self, timeout: float = STOP_WAIT_S + 30) -> str:
        """Stop the run on the node and read its state after, in one round trip."""
        try:
            return state_of(ask(self.transport, [self.stop_step(), self.status_step()], timeout)[1])
        except NodeCallError as e:
            return f"unreachable: {e.reason}"

    def exit_code(self) -> int | None:
        text = self.status()
        return int(text) if text.lstrip("-").isdigit() else None


def state_of(answer: dict) -> str:
    """A run state from the node program's answer to `status_step`."""
    return str(answer["ok"]).strip() if "error" not in answer else f"unreadable: {answer['error']}"


def node_runs(rdzv: Rendezvous, cluster: Cluster) -> list[NodeRun]:
    """The run's nodes, reached through the cluster's transports (its node answers shared)."""
    return [NodeRun(rdzv, plan, cluster.transport(plan, provider=rdzv.provider)) for plan in rdzv.nodes]


def run_nodes(cluster: Cluster, run_id: str | None = None) -> tuple[str, Path, list[NodeRun]]:
    """(run id, run folder, its nodes) of an existing run of `cluster`, the latest by default."""
    run_id, run_dir = cluster.find_run(run_id)
    return run_id, run_dir, node_runs(read_rendezvous(run_dir), cluster)


def node_states(nodes: list[NodeRun]) -> list[str]:
    """Each node's run state (running, exited N, ...), asked of all nodes at once."""
    return fan_out(lambda n: n.status(timeout=15), nodes)
