"""How a command that changes a cluster takes signals (docs/ARCHITECTURE.md, "A run lives on its
nodes"): the cluster's lock, with only an explicit request stopping a run (`changing`), and a
teardown that neither cuts short (`guarded_teardown`).

A Ctrl-C typed at the terminal (SIGINT while this process group holds the terminal's
foreground) is the user's stop. A termination is not: SIGTERM (a shutdown, a logout, systemd, a
CI cancel), SIGHUP (a closed terminal) and a SIGINT no terminal typed (a CI cancel sends one) are
taken as `on_signal` says. "detach" raises ops' Detach: until a run is started an interrupt like
Ctrl-C (the usual clean-up), once it goes the launch lets go of it and it goes on. "stop" raises
Terminated, taken like Ctrl-C: the run is stopped, and `up --down-after` destroys. A termination
after the first only repeats it: what the first set going (a clean-up, a stop) is not cut short.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading

import click

from fatpipe.infra.runs import cluster_lock
from fatpipe.ops.run.detach import Detach

from .ending import HEARD

TERMINATIONS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Terminated(KeyboardInterrupt):
    """A termination under `--on-signal stop`, raised like Ctrl-C so that the same clean-up runs
    (stop the nodes, tear down)."""


class TeardownAbandoned(KeyboardInterrupt):
    """The user chose, at the question a Ctrl-C during a teardown asks, to leave resources behind."""


@contextlib.contextmanager
def changing(project, name: str, command: str, on_signal: str = "detach"):
    """While `command` changes cluster `name`: hold its lock (a second such command is refused),
    and take a termination as `on_signal` says (module docstring). Yields the lock's early
    release (infra.runs.cluster_lock)."""
    HEARD.signum, HEARD.why, HEARD.stop = None, "", False
    with cluster_lock(project, name, command) as release, \
            _signal_handler(TERMINATIONS, _taking(on_signal)):
        yield release


def _taking(on_signal: str):
    def on_termination(signum, frame):
        typed = signum == signal.SIGINT and typed_at_the_terminal()
        if HEARD.signum is not None and not typed:  # the first one is being taken: this one repeats it
            return
        why = signal.Signals(signum).name
        if signum == signal.SIGINT and not typed:
            why = "SIGINT without a terminal (only a Ctrl-C typed at one stops a run)"
        HEARD.signum, HEARD.why, HEARD.stop = signum, why, typed or on_signal == "stop"
        if signum == signal.SIGHUP:
            silence_if_hung_up()
        if typed:
            raise KeyboardInterrupt
        raise Terminated(why) if HEARD.stop else Detach(why)

    return on_termination


def typed_at_the_terminal() -> bool:
    """Whether a SIGINT is a Ctrl-C typed at this command's terminal: its process group holds
    that terminal's foreground (a CI runner has no terminal; a background job does not hold it)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def silence_if_hung_up() -> None:
    """After SIGHUP: output to a terminal that hung up fails (EIO); it goes to /dev/null instead,
    so that what still has to run (a clean-up, a teardown) runs."""
    for fd in (1, 2):
        poll = select.poll()
        poll.register(fd, 0)  # a hang-up or an error is reported whatever is asked
        with contextlib.suppress(OSError):
            if any(events & (select.POLLHUP | select.POLLERR) for _, events in poll.poll(0)):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, fd)
                os.close(devnull)


@contextlib.contextmanager
def _signal_handler(signums: tuple[int, ...], handler):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before if before is not None else signal.SIG_DFL)


@contextlib.contextmanager
def guarded_teardown(out, what: str):
    """While a teardown runs, Ctrl-C does not cut it: on a terminal it asks whether to abandon it
    (resources stay, and cost), without one it is ignored; SIGTERM is ignored. The engine and the
    nodes run in sessions of their own, so only this process hears either. SIGHUP is ignored too."""
    asking = False

    def on_interrupt(signum, frame):
        nonlocal asking
        if asking:  # Ctrl-C at the question itself: the user insists
            raise TeardownAbandoned()
        if not sys.stdin.isatty():
            out.print(f"[yellow]{what} goes on[/]: without a terminal to ask, Ctrl-C does not abandon it")
            return
        asking = True
        try:
            leave = click.confirm(f"\n{what} is running; abandon it and leave resources behind?",
                                  default=False, err=True)
        except click.Abort:
            leave = True
        finally:
            asking = False
        if leave:
            raise TeardownAbandoned()
        out.print(f"{what} goes on")

    def on_terminate(signum, frame):
        if signum == signal.SIGHUP:
            silence_if_hung_up()
        with contextlib.suppress(OSError, RuntimeError):  # a line lost, never the teardown
            out.print(f"[yellow]{what} goes on[/]: a termination does not cut a teardown short")

    with _signal_handler((signal.SIGINT,), on_interrupt), \
            _signal_handler((signal.SIGTERM, signal.SIGHUP), on_terminate):
        yield
