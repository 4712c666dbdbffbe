"""One node's side of a run: the shell commands that start, watch and stop it there, and how it ended.

Each node runs `bash <run>/node-<rank>.sh` detached (`setsid`), its output in
`<run>/node-<rank>.log`, the session id in `node-<rank>.pid` (who that process is, its boot
and start time, in `node-<rank>.ident`: `runproc`) and torchrun's exit status in
`node-<rank>.exit`, all in the run folder on that node. So `fatpipe launch` may die and
`fatpipe logs` reattach.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fatpipe.infra.node import REMOTE_PKG

from ..reach.nodecall import NodeCallError, Step, answer_of, ask
from ..reach.transport import Transport, fan_out, transport_for
from .nodefiles import group_rank_file, lighthouse_args
from .rendezvous import NodePlan, Rendezvous, read_rendezvous
from .runproc import AGENT_TAG_ENV, AGENT_TAG_PREFIX

LIGHTHOUSE_MODULE = "fatpipe.trainer.live.lighthouse"

LOST = 255  # the status of a node whose process vanished without writing its exit status
# fatpipe stopped following a run whose node stayed out of reach: the run goes on on its nodes
# (sysexits' EX_TEMPFAIL: try again later, with `fatpipe logs -f`).
UNFOLLOWED = 75
STOP_WAIT_S = 10  # from SIGTERM to SIGKILL: torchrun stops its workers in this time
# Checks a run's process and stops it on the node: runproc.py, standard library only.
RUNPROC_FILE = Path(__file__).with_name("runproc.py")
RUNPROC = RUNPROC_FILE.read_text()
RUNPROC_SOURCE = (("runproc", RUNPROC_FILE),)
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
        self.script, self.log, self.pid, self.exit, self.stop, self.earlier, self.ident = (
            shlex.quote(f"{stem}.{ext}")
            for ext in ("sh", "log", "pid", "exit", "stop", "earlier.log", "ident")
        )
        self.name = plan.name

    def sh(self, snippet: str) -> str:
        """`snippet` run from the project folder on the node."""
        return f"cd {shlex.quote(self.plan.workdir)} && {snippet}"

    def start_command(self) -> str:
        inner = self._wrapper()
        return self.sh(
            # A run started again (`launch --run ID`) keeps the earlier attempts' log beside it.
            f"rm -f {self.exit} {self.pid} {self.stop} {self.ident} && "
            f"{{ [ ! -s {self.log} ] || cat {self.log} >> {self.earlier}; }} && : > {self.log} && "
            f"setsid -f bash -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 && "
            f"for i in $(seq 100); do [ -s {self.pid} ] && exit 0; sleep 0.1; done; "
            'echo "fatpipe: the node process did not start" >&2; exit 1'
        )

    def _wrapper(self) -> str:
        """The node's process: runs torchrun (node-<rank>.sh), restarts it when it was killed,
        and records its last status.

        It traps TERM/INT/HUP so that, when the group is signalled, it outlives torchrun (which
        shuts its workers down) and records torchrun's status. A torchrun killed by a signal
        that `fatpipe stop` did not send (stop leaves a marker first) is started again, up to
        the run's max_restarts times: its peers' agents see the new node in the rendezvous and
        restart the whole worker group, which resumes from the checkpoint. Node 0's is not: it
        hosts the rendezvous store, which died with it. Nor is the one torch made group rank 0
        (its record, `nodefiles.group_rank_file`, says 0): its agent hosted the store the workers
        share, and the other agents would keep sending their workers to its old address.
        torchrun exits 1 after a TERM it handled, so its own "got signal" line in this attempt's
        log tells that case apart.
        Each attempt's workers carry a tag, since they outlive a killed torchrun (each runs in
        a session of its own) and must go before the next attempt starts. Before its pid, the
        wrapper records who it is (boot id, start time: `runproc`), which the tag holds too.
        Under live fault tolerance each node's torchrun is a group of its own: any node's is
        started again, with no rendezvous to prepare, and the wrapper also keeps the node's
        Lighthouse and relay (`_lighthouse`) until it ends.
        """
        live = self.rdzv.live
        # Live: every node hosts its own store, so any node's torchrun may start again; it
        # rejoins through the Lighthouse, not torch's rendezvous.
        restarts = self.rdzv.max_restarts if live or self.plan.rank != 0 else 0
        leads = "false" if live else \
            f'[ "$(cat {shlex.quote(group_rank_file(self.rdzv, self.plan.rank))} 2>/dev/null)" = 0 ]'
        log = self.log
        host, _, port = self.rdzv.rdzv_endpoint.rpartition(":")
        python = f'"${{FATPIPE_PYTHON:-{self.plan.python}}}"'
        rejoin = "" if live else (
            f"timeout {REJOIN_TIMEOUT_S} {python} -c {shlex.join([REJOIN_PY, host, port, self.rdzv.run_id])} "
            f'>> {log} 2>&1 || echo "fatpipe: could not prepare the rendezvous for the new torchrun" >> {log}')
        lighthouse = self._lighthouse(python) if live else ""
        end_lighthouse = "kill $lh 2>/dev/null; " if lighthouse else ""
        return f"""read -r boot < /proc/sys/kernel/random/boot_id; st=$(< /proc/$$/stat); st=(${{st##*") "}})
start=${{st[19]}}; echo "$boot $start" > {self.ident}; echo $$ > {self.pid}; trap true TERM INT HUP; n=0
{lighthouse}while :; do
  from=$(stat -c %s {log} 2>/dev/null || echo 0); tag={AGENT_TAG_PREFIX}$$-$start-$n
  {AGENT_TAG_ENV}=$tag bash {self.script} >> {log} 2>&1 < /dev/null; rc=$?
  [ -e {self.stop} ] || [ $n -ge {restarts} ] || {leads} && break
  if [ $rc -gt 128 ] && [ $rc -lt 192 ]; then sig=$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))
  elif [ $rc -ne 0 ] && sig=$(tail -c +$((from + 1)) {log} | grep -o 'SignalException: Process [0-9]* got signal: [0-9A-Za-z.]*' | tail -n 1 | sed 's/.*: //') && [ -n "$sig" ]; then :
  else break; fi
  left=$({_tagged_pids('$tag')}); [ -n "$left" ] && kill -KILL $left 2>/dev/null
  n=$((n + 1))
  echo "fatpipe: torchrun on {self.name} ended by signal $sig, not by fatpipe stop: starting it again (restart $n of {restarts})" >> {log}
  {rejoin}
done
{end_lighthouse}echo $rc > {self.exit}.tmp; mv {self.exit}.tmp {self.exit}"""

    def _lighthouse(self, python: str) -> str:
        """The node's relay to the run's serving Lighthouse, and its own Lighthouse where the
        run has one per node (trainer.live.lighthouse), beside torchrun for the whole run and
        started again a second after it dies; its lines go to the node's log."""
        path = f'PYTHONPATH="$PWD/{REMOTE_PKG}" ' if self.plan.transport == "ssh" else ""
        args = lighthouse_args(self.rdzv, self.plan.rank)
        run = f"{path}{python} -m {LIGHTHOUSE_MODULE} {shlex.join(args)}"
        return (f"( trap 'kill $c 2>/dev/null; exit 0' TERM INT HUP; while :; do {run} & c=$!; "
                f"wait $c; sleep 1; done ) >> {self.log} 2>&1 < /dev/null & lh=$!\n")

    def follow_command(self, follow: bool = True, offset: int = 0) -> str:
        """The node's log from byte `offset` on: to its end, or (`follow`) until its process has
        exited (tail --pid), after printing the rest; a follower that lost its connection
        resumes where it was."""
        start = f"-c +{int(offset) + 1}"
        rest = f"if [ -e {self.log} ]; then exec tail {start} {self.log}; fi"  # a log not there adds nothing
        if not follow:
            return self.sh(rest)
        # tail waits on the wrapper's pid only while it is the run's (a reused pid is a stranger's).
        pid = self._runproc("pid", self.pid, self.ident)
        return self.sh(f'p=$({pid}); if [ -n "$p" ]; then '
                       f'exec tail {start} -s 0.5 -F --pid="$p" {self.log} 2>/dev/null; fi; {rest}')

    def status_command(self) -> str:
        """Prints the node's exit status, running, lost (its process is gone, or its pid is
        another process's now) or not-started."""
        return self.sh(self._runproc("status", self.pid, self.ident, self.exit))

    def stop_command(self) -> str:
        """Stops the run's processes on the node, and nothing else (`runproc.stop`)."""
        return self.sh(self._runproc("stop", self.pid, self.ident, self.exit, self.stop,
                                     str(STOP_WAIT_S)))

    def _runproc(self, action: str, *quoted: str) -> str:
        """`runproc` on the node with `action` and its arguments (already quoted)."""
        return f"python3 -c {shlex.quote(RUNPROC)} {action} {' '.join(quoted)}"

    def status_step(self) -> Step:
        """The node program's step that answers the run's state on the node (`runproc.status`)."""
        return Step("runproc.status", self._files("pid", "ident", "exit"), self.plan.workdir, RUNPROC_SOURCE)

    def stop_step(self) -> Step:
        """The node program's step that stops the run's processes there, and nothing else."""
        return Step("runproc.stop", (*self._files("pid", "ident", "exit", "stop"), STOP_WAIT_S),
                    self.plan.workdir, RUNPROC_SOURCE)

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


def _tagged_pids(tag_pattern: str) -> str:
    """A shell command listing the pids whose environment holds AGENT_TAG_ENV=`tag_pattern`
    (a grep pattern; may hold shell variables)."""
    return (f'grep -lzx "{AGENT_TAG_ENV}={tag_pattern}" /proc/[0-9]*/environ 2>/dev/null '
            "| cut -d/ -f3")


def node_runs(rdzv: Rendezvous, state_dir: Path) -> list[NodeRun]:
    return [NodeRun(rdzv, plan, transport_for(plan, state_dir, provider=rdzv.provider)) for plan in rdzv.nodes]


def run_nodes(project, cluster: str, run_id: str | None = None) -> tuple[str, Path, list[NodeRun]]:
    """(run id, run folder, its nodes) of an existing run of `cluster`, the latest by default."""
    from fatpipe.infra.runs import find_run

    run_id, run_dir = find_run(project, cluster, run_id)
    return run_id, run_dir, node_runs(read_rendezvous(run_dir), project.state_dir(cluster))


def node_states(nodes: list[NodeRun]) -> list[str]:
    """Each node's run state (running, exited N, ...), asked of all nodes at once."""
    return fan_out(lambda n: n.status(timeout=15), nodes)
