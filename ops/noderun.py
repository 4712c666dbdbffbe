"""One node's side of a run: the shell commands that start, watch and stop it there, and how it ended.

Each node runs `bash <run>/node-<rank>.sh` detached (`setsid`), its output in
`<run>/node-<rank>.log`, the session id in `node-<rank>.pid` and torchrun's exit status in
`node-<rank>.exit`, all in the run folder on that node. So `fatpipe launch` may die and
`fatpipe logs` reattach.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .rendezvous import NodePlan, Rendezvous, read_rendezvous
from .transport import Transport, fan_out, transport_for

LOST = 255  # the status of a node whose process vanished without writing its exit status
STOP_WAIT_S = 10  # from SIGTERM to SIGKILL: torchrun stops its workers in this time
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
    from fatpipe.infra.runs import find_run

    run_id, run_dir = find_run(project, cluster, run_id)
    return run_id, run_dir, node_runs(read_rendezvous(run_dir), project.state_dir(cluster))


def node_states(nodes: list[NodeRun]) -> list[str]:
    """Each node's run state (running, exited N, ...), asked of all nodes at once."""
    return fan_out(lambda n: n.status(timeout=15), nodes)
