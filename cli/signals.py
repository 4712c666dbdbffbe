"""How a command that changes a cluster takes Ctrl-C and SIGTERM: the cluster's lock with SIGTERM
raised like Ctrl-C (`changing`), and a teardown that neither cuts short (`guarded_teardown`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

import click


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same clean-up runs (stop the nodes, tear down)."""


TERMINATED = threading.Event()  # set by SIGTERM: code that caught the interrupt as Ctrl-C can tell


class TeardownAbandoned(KeyboardInterrupt):
    """The user chose, at the question a Ctrl-C during a teardown asks, to leave resources behind."""


@contextlib.contextmanager
def changing(project, name: str, command: str):
    """While `command` changes cluster `name`: hold its lock (a second such command is refused),
    and take SIGTERM like Ctrl-C, so that a termination stops terraform and the nodes cleanly.
    Yields the lock's early release (infra.runs.cluster_lock)."""
    from fatpipe.infra.runs import cluster_lock

    with cluster_lock(project, name, command) as release, _signal_handler(signal.SIGTERM, _raise_terminated):
        yield release


def _raise_terminated(signum, frame):
    TERMINATED.set()
    raise Terminated()


@contextlib.contextmanager
def _signal_handler(signum: int, handler):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def guarded_teardown(out, what: str):
    """While a teardown runs, Ctrl-C does not cut it: on a terminal it asks whether to abandon it
    (resources stay, and cost), without one it is ignored; SIGTERM is ignored. The engine and the
    nodes run in sessions of their own, so only this process hears either."""
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
        out.print(f"[yellow]{what} goes on[/]: a termination does not cut a teardown short")

    with _signal_handler(signal.SIGINT, on_interrupt), _signal_handler(signal.SIGTERM, on_terminate):
        yield
