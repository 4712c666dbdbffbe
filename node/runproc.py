"""On a node: whether a run's wrapper is still the process that started it, and stopping the run
without signalling any other process.

A pid names a process only while that process lives: once the wrapper is gone (the node
rebooted, the process was killed) the kernel may give its pid to any other process, root's by
default. So the wrapper (supervisor.py) records who it is before its pid: the
kernel's boot id and its own start time (field 22 of /proc/<pid>/stat, clock ticks since boot)
in node-<rank>.ident. A pid counts as the run's only while its process has that start time in
that boot; otherwise the run's process is gone ("lost") and nothing is signalled. Every signal
goes to a process whose start time was checked just before it, so a pid reused while `stop`
waits is not hit either. The workers torchrun leaves behind (sessions of their own, nobody's
children once torchrun is killed) are found by their tag, AGENT_TAG_ENV, which holds the
wrapper's pid and start time: no other wrapper's workers carry it. Each attempt's keeper (the
wrapper's child that runs torchrun) records itself the same way in node-<rank>.keeper, and its
attempt's status once torchrun ends: a wrapper killed alone leaves the node running while its
keeper lives, and then ended with the status the keeper recorded, never "lost".

Standard library only, Python 3.8. `noderun` asks `status` and `stop` through the node program
(ops/reach/asknode.py), run from the project folder; a follower's `tail --pid` takes the pid from
this file sent as `python3 -c`, with the action and the run's per-node file names as arguments:
    status PID IDENT EXIT [KEEPER]         prints the exit status, running, lost or not-started pid
    PID IDENT [KEEPER]                 prints the pid of the run's process while it lives, else
    nothing stop PID IDENT EXIT STOP WAIT_S [KEEPER]
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import time

# Every process of one torchrun attempt carries AGENT_TAG_ENV=<prefix><pid>-<start time>-<attempt>
# (the wrapper's pid and start time).
AGENT_TAG_ENV = "FATPIPE_AGENT"
AGENT_TAG_PREFIX = "fatpipe-"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
KILL_WAIT_S = 2.0  # after SIGKILL: the processes' exit is the kernel's, and quick


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def boot_id() -> str:
    return (_read(BOOT_ID) or "").strip()


def proc_stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) of `pid`, or None when there is no such process."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the name before may hold spaces and ")"
    return fields[0], int(fields[1]), fields[19]


def same(pid: int, start: str) -> bool:
    """Whether `pid` is still the process that started at `start` (a zombie has ended)."""
    found = proc_stat(pid)
    return found is not None and found[0] not in "ZXx" and found[2] == start


class Wrapper:
    """What the wrapper recorded: its pid and, since they are recorded, boot id and start time."""

    def __init__(self, pid_file: str, ident_file: str):
        self.pid_file = pid_file
        text = (_read(pid_file) or "").strip()
        self.pid = int(text) if text.isdigit() and int(text) > 0 else None
        ident = _read(ident_file)
        self.recorded = ident is not None  # no file: a wrapper of an older fatpipe
        parts = (ident or "").split()
        self.boot, self.start = parts if len(parts) == 2 and parts[1].isdigit() else (None, None)

    def this_boot(self) -> bool:
        """Whether the wrapper started in this boot (an older wrapper's record cannot say: yes)."""
        return not self.recorded or (self.boot is not None and self.boot == boot_id())

    def start_time(self) -> str | None:
        """The wrapper's start time; for an older wrapper, its live process's, found by the command
        line it was started with (which names its pid file). None: not this run's process."""
        if self.pid is None or not self.this_boot():
            return None
        if self.recorded:
            return self.start
        cmdline = _read(f"/proc/{self.pid}/cmdline") or ""
        found = proc_stat(self.pid)
        mine = f"echo $$ > {shlex.quote(self.pid_file)}; " in cmdline
        return found[2] if mine and found else None

    def alive(self) -> bool:
        start = self.start_time()
        return start is not None and same(self.pid, start)

    def tag(self) -> re.Pattern | None:
        """The tag every process of this wrapper's attempts carries; None: none can be alive."""
        if self.pid is None or not self.this_boot() or (self.recorded and self.start is None):
            return None
        if not self.recorded and self.start_time() is None:  # an older wrapper's, only while it lives
            return None
        attempt = rf"{self.start}-(\d+|lh)" if self.recorded else r"\d+"  # lh: its Lighthouse
        return re.compile(rf"{AGENT_TAG_ENV}={AGENT_TAG_PREFIX}{self.pid}-{attempt}")


class Keeper:
    """What an attempt's keeper recorded (supervisor.py): `<pid> <attempt> <boot id> <start
    time>`, and once its child ended `<status> signal|exit` (how the child ended)."""

    def __init__(self, path: str | None):
        parts = (_read(path) or "").split() if path else []
        ok = len(parts) in (4, 6) and parts[0].isdigit() and parts[1].isdigit() and parts[3].isdigit()
        self.pid, self.attempt = (int(parts[0]), int(parts[1])) if ok else (None, None)
        self.boot, self.start = (parts[2], parts[3]) if ok else (None, None)
        self.status = parts[4] if ok and len(parts) == 6 and parts[4].isdigit() else None
        self.signalled = self.status is not None and parts[5] == "signal"

    def alive(self) -> bool:
        return self.pid is not None and self.boot == boot_id() and same(self.pid, self.start)


def processes() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (parent pid, start time)."""
    table = {}
    for name in os.listdir("/proc"):
        found = proc_stat(int(name)) if name.isdigit() else None
        if found and found[0] not in "ZXx":
            table[int(name)] = (found[1], found[2])
    return table


def tagged(table: dict[int, tuple[int, str]], tag: re.Pattern) -> set[int]:
    found = set()
    for pid in table:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().decode(errors="replace").split("\0")
        except OSError:  # gone, or another user's
            continue
        if any(tag.fullmatch(entry) for entry in entries):
            found.add(pid)
    return found


def descendants(table: dict[int, tuple[int, str]], root: int) -> set[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def signal_same(pid: int, start: str, sig: int) -> None:
    """Signal `pid` only while it is the process that started at `start`."""
    if same(pid, start):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait(done, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)


def status(pid_file: str, ident_file: str, exit_file: str, keeper_file: str | None = None) -> str:
    def ended() -> str | None:
        text = _read(exit_file)
        return None if text is None else text.strip()

    if ended() is not None:
        return ended()
    if _read(pid_file) is None:
        return "not-started"
    if Wrapper(pid_file, ident_file).alive():
        return "running"
    # The wrapper is gone: its last keeper's record says how the trainer ended, or that it runs.
    keeper = Keeper(keeper_file)
    if keeper.status is None and keeper.alive():
        return "running"
    return ended() or Keeper(keeper_file).status or "lost"  # either may have been written since


def stop(pid_file: str, ident_file: str, exit_file: str, stop_file: str, wait_s: float,
         keeper_file: str | None = None) -> None:
    """Stop the run: the stop marker first (the wrapper must not start torchrun again), TERM to
    the wrapper's group (the wrapper outlives it and records torchrun's status), `wait_s` for
    that status (or for all of them to be gone), then KILL what is left of the wrapper's tree
    and its tagged workers (torchrun stuck in its exit barrier ignores TERM). A wrapper killed
    alone leaves its keeper: TERM to the keeper's tree and the tagged processes, and the keeper
    records the status. A lost wrapper's tagged workers get the same, with no status written:
    nothing recorded how that run ended."""
    exists = os.path.exists
    if exists(exit_file) or not exists(pid_file):
        return
    wrapper = Wrapper(pid_file, ident_file)
    start, tag = wrapper.start_time(), wrapper.tag()
    alive = start is not None and same(wrapper.pid, start)
    keeper = Keeper(keeper_file)
    kept = not alive and keeper.status is None and keeper.alive()  # a keeper records the status
    recorded = alive or kept
    table = processes()
    ours = tagged(table, tag) if tag else set()
    if recorded:
        ours |= descendants(table, wrapper.pid if alive else keeper.pid)
        with open(stop_file, "w"):
            pass
    ours = {pid: table[pid][1] for pid in ours if pid in table}
    if alive and same(wrapper.pid, start):
        try:  # its group: the leader lives, so the group is the wrapper's
            os.killpg(wrapper.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    elif not alive:
        for pid, started in ours.items():
            signal_same(pid, started, signal.SIGTERM)
    wait(lambda: (recorded and exists(exit_file)) or not any(same(p, s) for p, s in ours.items()),
         wait_s)
    left = {p: s for p, s in ours.items() if same(p, s)}
    for pid, started in left.items():
        signal_same(pid, started, signal.SIGKILL)
    wait(lambda: not any(same(p, s) for p, s in left.items()), KILL_WAIT_S)
    if recorded and not exists(exit_file):
        with open(exit_file, "w") as f:
            f.write("137\n")


def wrapper_pid(pid_file: str, ident_file: str, keeper_file: str | None = None) -> str:
    """The pid of the run's process while it lives (the wrapper's, else a keeper's that outlived
    it), else "": what a follower's `tail --pid` may wait on."""
    wrapper = Wrapper(pid_file, ident_file)
    if wrapper.alive():
        return str(wrapper.pid)
    keeper = Keeper(keeper_file)
    return str(keeper.pid) if keeper.status is None and keeper.alive() else ""


def main(argv: list[str]) -> int:
    action, files = argv[0], argv[1:]
    if action == "status":
        print(status(*files[:4]))
    elif action == "pid":  # what a follower's `tail --pid` may wait on: never a stranger
        print(wrapper_pid(*files[:3]))
    elif action == "stop":
        stop(*files[:4], float(files[4]), *files[5:6])
    else:
        print(f"unknown action {action!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
