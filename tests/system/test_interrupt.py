"""Teardown you can trust: a real `fatpipe up --down-after` on a netns sim cluster, stopped by Ctrl-C at
each phase (deploy, netcheck, launch), by SIGTERM under `--on-signal stop`, and a second Ctrl-C during
the teardown, with and without a terminal, leaves no namespace, veth, bridge or process behind, and no
traceback. The operator's machine never ends a run by accident: SIGTERM, SIGHUP and a SIGINT no
terminal typed during the run let go of it (exit 76): it goes on, and so does the cluster (a SIGINT
without a terminal takes the same path: tests/unit/test_shield.py).

Ctrl-C is what a terminal does: SIGINT to the whole foreground process group (the test starts fatpipe
in a session of its own and signals that group), or the ^C byte typed into a real pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import os
import queue
import re
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from conftest import skip_or_fail

from fatpipe.stacks.sim import net as simnet

pytestmark = pytest.mark.slow

TRAIN = ["--preset", "tiny", "--steps", "30", "--batch-size", "4", "--seq-len", "64", "--max-restarts", "0"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


@pytest.fixture
def cluster(needs_netns, project_dir, request):
    """A 2-node 1g netns sim cluster named for the test; whatever is left is removed after it."""
    if not __import__("shutil").which("terraform"):
        skip_or_fail("needs terraform on PATH")
    name, octet = request.param
    (project_dir / "fatpipe.toml").write_text(
        f'[clusters.{name}]\nprovider = "sim"\nnodes = 2\ntier = "1g"\nisolation = "netns"\n'
        f'private_cidr = "10.{octet}.0.0/24"\nrdzv_port = {29500 + octet}\n')
    yield name
    subprocess.run([sys.executable, "-m", "fatpipe.cli", "down", name], cwd=project_dir, capture_output=True,
                   timeout=180)
    simnet.sweep_cluster(name, project_dir / ".fatpipe" / name / "nodes")


def cli_env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("FATPIPE_CONFIG", None)
    return env


class Up:
    """`fatpipe up --down-after` running in a session of its own; its output read as it comes."""

    def __init__(self, folder: Path, *args: str, tty: bool = False):
        env = cli_env()
        argv = [sys.executable, "-m", "fatpipe.cli", "up", "--down-after", *args]
        self.lines: queue.Queue[str] = queue.Queue()
        self.text = ""
        if tty:  # a real terminal: fatpipe leads a session whose controlling terminal this is
            self.master, slave = os.openpty()
            self.proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=slave, stdout=slave, stderr=slave,
                                         preexec_fn=_take_terminal)
            os.close(slave)
            threading.Thread(target=self._read_pty, daemon=True).start()
        else:
            self.master = None
            self.proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                         start_new_session=True)
            threading.Thread(target=self._read_pipe, daemon=True).start()

    def _read_pipe(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def _read_pty(self):
        buffer = ""
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if not ready:
                if self.proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(self.master, 4096).decode(errors="replace")
            except OSError:
                break
            buffer += ANSI.sub("", chunk)
            *done, buffer = buffer.split("\n")
            for line in done:
                self.lines.put(line + "\n")
            if buffer.rstrip().endswith("[y/N]:"):  # a question waits for its answer on this line
                self.lines.put(buffer + "\n")
                buffer = ""

    def wait_for(self, pattern: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"up ended before {pattern!r}:\n{self.text[-4000:]}"
                continue
            self.text += line
            if re.search(pattern, line):
                return
        pytest.fail(f"no {pattern!r} within {timeout} s:\n{self.text[-4000:]}")

    def ctrl_c(self) -> None:
        if self.master is not None:
            os.write(self.master, b"\x03")
        else:
            os.killpg(self.proc.pid, signal.SIGINT)

    def finish(self, timeout: float = 240) -> int:
        code = self.proc.wait(timeout=timeout)
        time.sleep(0.5)
        while not self.lines.empty():
            self.text += self.lines.get()
        print(self.text[-6000:])
        return code


def _take_terminal():
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def assert_clean(folder: Path, name: str, text: str) -> None:
    for bad in ("Traceback", "Broken pipe", "Errno 32", "SignalException", "Exception ignored"):
        assert bad not in text, f"{bad!r} in the output"
    assert re.search(rf"{name}: (destroyed \d+ resource|nothing was deployed)", text), text[-3000:]
    assert simnet.leftover_netns(name) == []
    names = simnet.link_names(name, 0)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    assert names["bridge"] not in links and names["host_if"].rsplit("-", 1)[0] not in links, links
    assert not (folder / ".fatpipe" / name / "outputs.json").exists()
    deadline = time.monotonic() + 20
    while (left := processes_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"processes left in {folder}: {left}"


def processes_in(folder: Path) -> list[str]:
    """Processes (not zombies, not this test) whose working folder is the project or below it."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and (cwd == str(folder) or cwd.startswith(f"{folder}/")):
            found.append(f"{entry}: {cmd[:160]}")
    return found


@pytest.mark.parametrize("cluster", [("t-int-dep", 114)], indirect=True)
def test_ctrl_c_during_deploy(cluster, project_dir):
    up = Up(project_dir, "--netcheck", "off", "-v", *TRAIN)
    up.wait_for(r"Provisioning with 'local-exec'")  # terraform is creating the nodes
    up.ctrl_c()
    code = up.finish()
    assert code == 130
    assert_clean(project_dir, cluster, up.text)


@pytest.mark.parametrize("cluster", [("t-int-net", 115)], indirect=True)
def test_ctrl_c_during_netcheck(cluster, project_dir):
    # The full sweep: a torchrun job on the nodes through the launch path, cut mid-job (the quick
    # check is a program per node that ends with its standard input: tests/unit/test_quick_ring.py).
    up = Up(project_dir, "--netcheck", "full", "--no-gate", *TRAIN)
    up.wait_for(r"started run \S+-netcheck on 2 node")
    time.sleep(1)
    up.ctrl_c()
    code = up.finish()
    assert code == 130
    assert_clean(project_dir, cluster, up.text)
    # A netcheck cut short is no run: nothing became the latest.
    assert not (project_dir / ".fatpipe" / cluster / "runs" / "latest").exists()


@pytest.mark.parametrize("cluster", [("t-int-lau", 116)], indirect=True)
def test_ctrl_c_during_launch(cluster, project_dir):
    up = Up(project_dir, "--netcheck", "off", *TRAIN, tty=True)  # typed at the terminal: the user's stop
    up.wait_for(r"\] launch: ")
    up.wait_for(r"started run \S+ on 2 node")
    time.sleep(2)
    up.ctrl_c()
    code = up.finish()
    assert code == 130 and "the run was stopped on every node" in up.text
    assert_clean(project_dir, cluster, up.text)


def fatpipe(folder: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def detached_by(folder: Path, name: str, signum: int) -> str:
    """An `up --down-after` sent `signum` while its run trains: it lets go (exit 76) with the line that
    says how to reattach and to stop, and ends on the line that names the cluster left up and billing.
    The run id."""
    up = Up(folder, "--netcheck", "off", *LONG_TRAIN)
    up.wait_for(r"started run \S+ on 2 node")
    up.wait_for(r"step \d+")
    up.proc.send_signal(signum)
    code = up.finish()
    line = re.search(rf"detached on {signal.Signals(signum).name}: run (\S+) goes on on its nodes \(exit 76\); "
                     rf"`fatpipe logs {name} -f` reattaches, `fatpipe stop {name}` stops it", up.text)
    assert code == 76 and line, up.text[-3000:]
    last = [ln for ln in up.text.splitlines() if ln.strip()][-1]
    assert last.startswith(f"{name} stays up, and bills") and f"`fatpipe down {name}` destroys it" in last, last
    for bad in ("Traceback", "stopping every node", "down: destroy"):
        assert bad not in up.text, bad
    assert (folder / ".fatpipe" / name / "outputs.json").exists() and simnet.leftover_netns(name)
    return line.group(1)


LONG_TRAIN = ["--preset", "tiny", "--steps", "250", "--batch-size", "4", "--seq-len", "64", "--max-restarts", "0"]


@pytest.mark.parametrize("cluster", [("t-int-let", 119)], indirect=True)
def test_a_termination_lets_go_of_the_run_and_the_cluster_unless_asked_to_stop(cluster, project_dir):
    run_id = detached_by(project_dir, cluster, signal.SIGTERM)  # a laptop's shutdown, systemd, a CI cancel
    # The run went on without its operator: reattached, it trains to its last step and ends well.
    logs = fatpipe(project_dir, "logs", cluster, "-f", timeout=600)
    assert logs.returncode == 0 and "step 250/250" in logs.stdout, logs.stdout[-3000:] + logs.stderr
    assert (project_dir / ".fatpipe" / cluster / "runs" / "latest").read_text().strip() == run_id
    detached_by(project_dir, cluster, signal.SIGHUP)  # a closed terminal
    assert fatpipe(project_dir, "stop", cluster).returncode == 0  # an explicit request stops it
    # Unattended: --on-signal stop makes SIGTERM stop the run, and --down-after destroy.
    up = Up(project_dir, "--netcheck", "off", "--on-signal", "stop", *LONG_TRAIN)
    up.wait_for(r"started run \S+ on 2 node")
    up.wait_for(r"step \d+")
    os.kill(up.proc.pid, signal.SIGTERM)
    code = up.finish()
    assert code == 143 and "the run was stopped on every node" in up.text
    assert_clean(project_dir, cluster, up.text)


@pytest.mark.parametrize("cluster", [("t-int-term", 117)], indirect=True)
def test_sigterm_then_ctrl_c_during_the_teardown_without_a_terminal(cluster, project_dir):
    up = Up(project_dir, "--netcheck", "off", "--on-signal", "stop", *TRAIN)
    up.wait_for(r"started run \S+ on 2 node")
    os.kill(up.proc.pid, signal.SIGTERM)
    up.wait_for(r"down: destroy ")
    up.ctrl_c()  # no terminal to ask on: the teardown goes on
    up.wait_for(r"goes on")
    code = up.finish()
    assert code == 143
    assert_clean(project_dir, cluster, up.text)


@pytest.mark.parametrize("cluster", [("t-int-tty", 65)], indirect=True)
def test_ctrl_c_on_a_terminal_asks_before_abandoning_the_teardown(cluster, project_dir):
    up = Up(project_dir, "--netcheck", "off", *TRAIN, tty=True)
    up.wait_for(r"started run \S+ on 2 node")
    time.sleep(1)
    up.ctrl_c()
    up.wait_for(r"down: destroy ")
    up.ctrl_c()
    up.wait_for(r"abandon it and leave resources behind\? \[y/N\]")
    os.write(up.master, b"n\n")
    code = up.finish()
    assert code == 130 and "goes on" in up.text
    assert_clean(project_dir, cluster, up.text)
