"""Ctrl-C reaches fatpipe, not terraform or the CDK runtime; fatpipe passes it on once and waits.

Small stand-in processes play terraform: the behaviour under test is the process handling."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import termios
import time

import pytest

from fatpipe.cli import signals as steps
from fatpipe.cli.ending import interrupted_status
from fatpipe.stacks.shield import GROUP_WAIT_S, hold_signals, shield_cdk_runtime, stream

# Stands in for terraform: its own session, stops gracefully on the first SIGINT, leaves a child
# of its group running a little longer (what a killed provisioner's command does).
ENGINE = r"""
import os, signal, subprocess, sys, time
print("session", os.getsid(0) == os.getpid(), flush=True)
stopping = []
signal.signal(signal.SIGINT, lambda *a: stopping.append(1))
subprocess.Popen([sys.executable, "-c", "import time, pathlib, sys; time.sleep(1.0); "
                  "pathlib.Path(sys.argv[1]).write_text('made')", sys.argv[1]])
print("ready", flush=True)
for _ in range(100):
    if stopping:
        print("stopping gracefully", flush=True); time.sleep(0.3); sys.exit(1)
    time.sleep(0.05)
sys.exit(0)
"""


@pytest.fixture(autouse=True)
def terminations_at_their_default():
    """`nohup make test` starts the suite with SIGHUP ignored; these tests send terminations and
    check that fatpipe puts back the default, so each starts from it and leaves what it found."""
    found = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    for signum in found:
        signal.signal(signum, signal.SIG_DFL)
    yield
    for signum, handler in found.items():
        signal.signal(signum, handler)


def test_an_interrupt_is_passed_on_once_and_waited_for(tmp_path):
    made = tmp_path / "made"
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if line == "ready":  # Ctrl-C reaches this process alone: the engine has a session of its own
            os.kill(os.getpid(), signal.SIGINT)

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        stream([sys.executable, "-c", ENGINE, str(made)], tmp_path, log, dict(os.environ))
    assert "session True" in lines and "stopping gracefully" in lines
    assert any("interrupted" in line for line in lines)
    # The group's straggler finished before stream returned: its result exists for a teardown,
    # and the wait for the group ended with it, not at the wait's own bound.
    assert made.read_text() == "made" and time.monotonic() - started < GROUP_WAIT_S


def test_a_log_that_breaks_does_not_break_the_process(tmp_path):
    def closed(_line):
        raise BrokenPipeError(32, "Broken pipe")

    out = stream([sys.executable, "-c", "print('a'); print('b')"], tmp_path, closed, dict(os.environ))
    assert out == "a\nb"


def test_signals_wait_until_a_synth_is_done():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with hold_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            reached.append("end of block")
    assert reached == ["end of block"]


def test_the_cdk_runtime_starts_in_a_session_of_its_own():
    from jsii._kernel.providers import process

    shield_cdk_runtime()
    shield_cdk_runtime()  # twice is once
    proc = process.subprocess.Popen([sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid())"],
                                    stdout=process.subprocess.PIPE, text=True)
    assert proc.communicate(timeout=30)[0].strip() == "True"


class Out:
    def __init__(self):
        self.lines: list[str] = []

    def print(self, text, **_):
        self.lines.append(text)


def test_a_teardown_without_a_terminal_goes_on(monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    out = Out()
    with steps.guarded_teardown(out, "the teardown of demo"):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)  # a terminal closed meanwhile
        time.sleep(0.1)
    assert any("goes on" in line and "Ctrl-C" in line for line in out.lines)
    assert sum("termination" in line for line in out.lines) == 2


@pytest.mark.parametrize("answer", [True, False])
def test_a_teardown_on_a_terminal_asks_before_it_is_abandoned(monkeypatch, answer):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    asked = []
    monkeypatch.setattr(steps.click, "confirm", lambda question, **_: asked.append(question) or answer)
    out = Out()
    if answer:
        with pytest.raises(steps.TeardownAbandoned):
            with steps.guarded_teardown(out, "the teardown of demo"):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)
    else:
        with steps.guarded_teardown(out, "the teardown of demo"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        assert out.lines == ["the teardown of demo goes on"]
    assert "abandon it and leave resources behind?" in asked[0]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def changing_hears(signum: int, on_signal: str = "detach"):
    """What `changing` raises when this process gets `signum`, and what it recorded."""
    from fatpipe.infra.project import load_project

    try:
        with steps.changing(load_project(), "demo", "up", on_signal):
            os.kill(os.getpid(), signum)
            time.sleep(1)
    except KeyboardInterrupt as e:
        return e
    finally:
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    raise AssertionError("nothing was raised")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_termination_lets_go_of_a_run_unless_asked_to_stop_it(project_dir, signum):
    from fatpipe.ops.run.detach import Detach

    heard = changing_hears(signum)  # a shutdown, a logout, a closed terminal, a CI cancel
    assert type(heard) is Detach and heard.why == signal.Signals(signum).name
    assert not steps.HEARD.stop and interrupted_status() == 128 + signum
    heard = changing_hears(signum, "stop")  # --on-signal stop: taken like Ctrl-C
    assert type(heard) is steps.Terminated and steps.HEARD.stop


def test_a_second_termination_does_not_cut_short_what_the_first_set_going(project_dir):
    from fatpipe.infra.project import load_project
    from fatpipe.ops.run.detach import Detach

    with steps.changing(load_project(), "demo", "up"):
        with pytest.raises(Detach):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)  # during the clean-up (a stop, a pull): it goes on
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.2)
    assert steps.HEARD.why == "SIGTERM"


def test_only_a_ctrl_c_typed_at_the_terminal_stops(project_dir, monkeypatch):
    from fatpipe.ops.run.detach import Detach, detached_line

    monkeypatch.setattr(steps, "typed_at_the_terminal", lambda: False)
    heard = changing_hears(signal.SIGINT)  # sent by a program (a CI cancel): lets go, and says so
    assert type(heard) is Detach and not steps.HEARD.stop
    line = detached_line(heard.why, "r1", "demo")
    assert line.startswith("detached on SIGINT without a terminal (only a Ctrl-C typed at one stops a run): "
                           "run r1 goes on on its nodes (exit 76); `fatpipe logs demo -f` reattaches, "
                           "`fatpipe stop demo` stops it"), line
    monkeypatch.setattr(steps, "typed_at_the_terminal", lambda: True)
    heard = changing_hears(signal.SIGINT)
    assert type(heard) is KeyboardInterrupt and steps.HEARD.stop and interrupted_status() == 130


TYPED = "from fatpipe.cli.signals import typed_at_the_terminal as t; print(t(), flush=True)"


def test_a_terminal_is_one_whose_foreground_this_process_holds():
    def on_a_terminal():  # a session of its own whose controlling terminal is the pty
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    master, slave = os.openpty()
    with os.fdopen(master, "rb", buffering=0) as out:
        proc = subprocess.run([sys.executable, "-c", TYPED], stdin=slave, stdout=slave, stderr=slave,
                              preexec_fn=on_a_terminal, timeout=60)
        os.close(slave)
        assert proc.returncode == 0 and out.read(64).strip() == b"True"
    none = subprocess.run([sys.executable, "-c", TYPED], capture_output=True, text=True, start_new_session=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert none.stdout.strip() == "False", none.stderr  # a CI runner's, or a daemon's


HUNG_UP = """
import os, sys
from fatpipe.cli.signals import silence_if_hung_up
master, slave = os.openpty()
os.dup2(slave, 1)
os.close(master)  # the terminal hangs up
try:
    os.write(1, b"x")
except OSError as e:
    print("before", e.errno, file=sys.stderr)
silence_if_hung_up()
os.write(1, b"x")
print("after: written", file=sys.stderr)
"""


def test_after_a_hang_up_output_goes_nowhere_instead_of_failing():
    proc = subprocess.run([sys.executable, "-c", HUNG_UP], capture_output=True, text=True, timeout=60)
    assert proc.stderr.split("\n")[:2] == ["before 5", "after: written"], proc.stderr  # EIO, then fine


def test_a_termination_after_the_run_ended_lets_its_results_come_back_first(monkeypatch):
    from fatpipe.ops.run import launch
    from fatpipe.ops.run.detach import Detach

    tries: list[int] = []

    def pull_ended(nodes, run_dir, within_s, log):
        tries.append(1)
        if len(tries) == 1:
            raise Detach("SIGTERM")  # mid-pull
        return ["n1: pull failed"]

    monkeypatch.setattr(launch, "pull_ended", pull_ended)
    said: list[str] = []
    assert launch.pull_through([], None, 1, said.append) == ["n1: pull failed"] and len(tries) == 2
    assert said == ["SIGTERM: the run has ended; its results come back first"]
