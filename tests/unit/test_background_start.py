"""The suite passes when it is started as a background job, which inherits an ignored SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_child_hears_ctrl_c():
    """Run alone this always passes; run under an ignored SIGINT (the test below) it is the check."""
    probe = "import signal, sys; sys.exit(signal.getsignal(signal.SIGINT) is not signal.default_int_handler)"
    assert subprocess.run([sys.executable, "-c", probe], timeout=60).returncode == 0


def test_the_interrupt_tests_pass_in_a_background_job(tmp_path):
    """As `nohup make test &` starts them: SIGINT and SIGHUP ignored in pytest and everything it starts."""
    tests = ["tests/unit/test_shield.py", "tests/unit/test_background_start.py::test_a_child_hears_ctrl_c"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"), *tests],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: [signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGHUP)],
    )
    assert done.returncode == 0, done.stdout[-3000:]
