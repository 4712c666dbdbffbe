"""How a command's end is told, the standard library alone: `fatpipe --help` imports it (through
`main`) and so must stay light. The signal a command took last (`HEARD`, set by `signals`), the
exit status and word an interrupt ends with, and the quiet exit after a reader went away."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass


@dataclass
class Heard:
    """The signal this command took last: its number, how it is named in a line, and whether it
    asked to stop (a Ctrl-C typed at the terminal, or `--on-signal stop`) rather than to let go."""

    signum: int | None = None
    why: str = ""
    stop: bool = False


HEARD = Heard()


def interrupted_status() -> int:
    """The exit status of a command an interrupt ended: 128 + the signal it took (130: Ctrl-C)."""
    return 128 + (HEARD.signum or signal.SIGINT)


def interrupted_word() -> str:
    """How the verdict names that end: interrupted (SIGINT), or terminated and by what."""
    return "interrupted" if HEARD.signum in (None, signal.SIGINT) else f"terminated ({HEARD.why})"


def silence_output() -> None:
    """After the reader of our output went away (a closed pipe): send the rest to /dev/null, so
    that what still has to run (a teardown) runs, and exit raises no second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(devnull, fd)
    os.close(devnull)
