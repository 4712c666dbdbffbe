"""Ctrl-C reaches fatpipe, not terraform or the CDK runtime; fatpipe passes it on once and waits.

Small stand-in processes play terraform: the behaviour under test is the process handling."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from fatpipe.cli import signals as steps
from fatpipe.stacks.shield import hold_signals, shield_cdk_runtime, stream

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
    # The group's straggler finished before stream returned: its result exists for a teardown.
    assert made.read_text() == "made" and time.monotonic() - started < 10


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
        time.sleep(0.1)
    assert any("goes on" in line and "Ctrl-C" in line for line in out.lines)
    assert any("termination" in line for line in out.lines)


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


def test_sigterm_while_changing_a_cluster_is_taken_like_ctrl_c(project_dir):
    from fatpipe.infra.project import load_project

    with pytest.raises(steps.Terminated):
        with steps.changing(load_project(), "demo", "deploy"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    steps.TERMINATED.clear()
