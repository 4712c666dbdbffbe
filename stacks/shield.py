"""Run terraform, tofu, cdktf and the CDK runtime so that Ctrl-C stops fatpipe, never them halfway.

The terminal sends Ctrl-C's SIGINT to its whole foreground process group. terraform cut there
stops with half-made resources; jsii's node process (the CDK runtime) cut there dies, and every
later synth in this process fails with a broken pipe (so a teardown after Ctrl-C could not even
synthesize its stack). So each of them starts in a session of its own, and fatpipe passes an
interrupt on deliberately: once, to terraform alone, which then stops gracefully and writes its
state. A synth is never cut in the middle of a call into the runtime: signals wait until it ends.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.lazy import load

Log = Callable[[str], None]
GROUP_WAIT_S = 120  # how long leftovers of an engine's process group get to finish


class _SessionSubprocess:
    """`subprocess` as jsii sees it: the same module, but Popen starts a session of its own."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs):  # noqa: N802 - stands in for subprocess.Popen
        return subprocess.Popen(*args, start_new_session=True, **kwargs)


def shield_cdk_runtime() -> None:
    """Make the CDK runtime (jsii's node process) start outside the terminal's process group.

    Takes effect for a runtime not started yet (it starts at the first use of cdktf). jsii offers
    no setting for it, so its module's view of `subprocess` is swapped; a jsii laid out otherwise
    is left as it is (synth still works, unshielded from the terminal).
    """
    try:
        process = load("jsii._kernel.providers").process
    except (ImportError, AttributeError):
        return
    if hasattr(process, "subprocess") and not isinstance(process.subprocess, _SessionSubprocess):
        process.subprocess = _SessionSubprocess()


@contextlib.contextmanager
def hold_signals():
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then deliver the first one to the usual handler.

    For a synth: a jsii call cut in half leaves the runtime's answers out of step with its
    questions, and every later call in this process fails. Works in the main thread only (the
    only one Python delivers signals to); elsewhere the block just runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(caught[0])


def stream(argv: list, cwd, log: Log, env: dict) -> str:
    """Run `argv` in its own session, handing each output line to `log`; return its stdout.

    Ctrl-C (KeyboardInterrupt, also what fatpipe makes of SIGTERM) is passed to the process
    once as SIGINT; the output is read on until it exits, then the interrupt goes on up. More
    interrupts meanwhile only wait: a second SIGINT makes terraform quit without saving its state.
    A `log` that fails (a closed pipe) is dropped, never the process it reports on.
    """
    tail: collections.deque[str] = collections.deque(maxlen=60)
    out: list[str] = []
    interrupted: BaseException | None = None
    with subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, start_new_session=True) as proc:
        while True:
            try:
                for line in proc.stdout:
                    line = line.rstrip("\n")
                    out.append(line)
                    tail.append(line)
                    log = _tell(log, line)
                break
            except KeyboardInterrupt as e:
                if interrupted is None:
                    interrupted = e
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGINT)
                    log = _tell(log, f"fatpipe: interrupted; {os.path.basename(str(argv[0]))} is stopping "
                                     "and saving its state")
    # terraform stops a provisioner by killing its shell; the command under it (a sim node-up)
    # may run on. What it makes must exist before anything is destroyed or swept, so wait for
    # the whole session to end.
    wait_for_group(proc.pid, log)
    if interrupted is not None:
        raise interrupted
    if proc.returncode != 0:
        raise FatpipeError(error_lines(list(tail)) or f"{argv[0]} exited with {proc.returncode}")
    return "\n".join(out)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies count as gone: some containers reap late)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def wait_for_group(pgid: int, log: Log, timeout_s: float = GROUP_WAIT_S) -> None:
    """Wait until nothing of process group `pgid` runs (an engine's provisioners left behind)."""
    deadline = time.monotonic() + timeout_s
    told = False
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        if not told:
            log(f"fatpipe: waiting for {len(left)} process(es) the engine started to finish")
            told = True
        with contextlib.suppress(KeyboardInterrupt):  # what they make must be known before a teardown
            time.sleep(0.2)
    if left:
        log(f"fatpipe: {len(left)} process(es) the engine started still run after {timeout_s:g} s: "
            f"{' '.join(map(str, left))}")


def _tell(log: Log, line: str) -> Log:
    try:
        log(line)
    except (BrokenPipeError, OSError, ValueError):  # the reader went away: keep the process going
        return lambda _line: None
    return log


def capture(argv: list, cwd, env: dict) -> str:
    """Run `argv` quietly in its own session and return its stdout (terraform warns on stderr)."""
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, text=True, capture_output=True,
                          start_new_session=True)
    if proc.returncode != 0:
        raise FatpipeError(error_lines(proc.stderr.splitlines()) or f"{argv[0]} exited with {proc.returncode}")
    return proc.stdout


# terraform prints a failed local-exec as "Error running command '...': exit status 1. Output: ..."
# with the command's output folded into its diagnostic; fatpipe's message starts with "Error: ".
PROVISIONER_ERROR = re.compile(r"Error running command .*?Output:.*?\bError: (.+?)(?= Error: | with \w+\.|$)")


def provisioner_message(lines: list[str]) -> str | None:
    """fatpipe's own one-line error from inside a failed provisioner's output (`fatpipe sim` or
    `fatpipe ssh-node`), unwrapped: it names the node, where terraform's own says only
    "local-exec provisioner error"."""
    text = " ".join(line.strip(" │╷╵") for line in lines if line.strip(" │╷╵"))
    found = PROVISIONER_ERROR.search(text)
    return found.group(1).strip() if found else None


def error_lines(lines: list[str]) -> str:
    """From terraform's first `Error:` diagnostic on (not a provisioner's echo), else the last lines."""
    own = provisioner_message(lines)
    if own:
        return own
    for i, line in enumerate(lines):
        if line.lstrip("│╷ ").startswith("Error:"):
            kept = [x for x in lines[i:i + 20] if x.strip(" │╷╵")]
            return "\n".join([kept[0].lstrip("│╷ ").removeprefix("Error: "), *kept[1:]])
    return "\n".join(lines[-10:])
