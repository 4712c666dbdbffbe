"""On a node: the process that runs one node's side of a run, starts it again after a signal and
records how it ended (docs/ARCHITECTURE.md, "A run lives on its nodes").

Standard library only, Python 3.8. `noderun.NodeRun.start_command` sends this file, runproc.py
loaded before it, as the program of `python3 -c` from the project folder, with `start` and the
run's settings as one JSON argument: no value of the run's (its interpreter, its files) is ever
shell text. `start` clears the last start's records, keeps an earlier log beside the new one and
forks the supervisor into a session of its own; it returns once the supervisor recorded its pid.

The supervisor records who it is (boot id and start time, node-<rank>.ident: `runproc`) before
its pid (node-<rank>.pid). Each attempt is run by a keeper, a child of the supervisor in its
group: the keeper records who it is in node-<rank>.keeper, runs `bash node-<rank>.sh` (which
execs torchrun) with its output appended to node-<rank>.log, and adds the attempt's exit status
to its record once the child is done. A status is the child's own (a signal's as 128 + its
number, as a shell reports it), never read from the log, which the user's script writes too:
torchrun run through `trainer.agent` dies of a signal it handled. The supervisor writes the
node's last status to node-<rank>.exit. Both ignore TERM, INT and HUP (a handler, which exec resets, so
torchrun still gets them): when `runproc.stop` signals the group, they outlive torchrun and record
its status.

A keeper whose supervisor died (killed alone: `kill -9` of the pid in node-<rank>.pid) records
the node's end itself once its child ends, and ends the node's Lighthouse: the trainer's end is
never "lost" for want of its wrapper. While the keeper lives, `runproc` reads the node as running.

An attempt that died of a signal `fatpipe stop` did not send (stop leaves node-<rank>.stop
first) is started again, up to `restarts` times: its peers' agents see the new node in the
rendezvous and restart the whole worker group, which resumes from the checkpoint. Not where
`leads` names a file that says 0 (torch made this node group rank 0: its agent hosted the store
the workers share, whose old address the other agents keep). Each attempt's processes carry
AGENT_TAG_ENV=<prefix><pid>-<start time>-<attempt>, the Lighthouse's `...-lh`: a killed
torchrun's workers (sessions of their own) are found by it and killed before the next attempt.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import runproc  # loaded before this program on the node (noderun.SUPERVISOR)

START_WAIT_S = 10  # for the supervisor's pid file, once forked
TICK_S = 0.2  # how often the supervisor looks at its keeper and the Lighthouse
LIGHTHOUSE_AGAIN_S = 1.0  # a Lighthouse that died is started again after this
LIGHTHOUSE_TAG = "lh"
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _remove(*paths):
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _write(path, text):
    """`text` in `path` whole or not at all: a reader never sees half of it."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def note(log, line):
    with open(log, "a") as f:
        f.write("fatpipe: " + line + "\n")


def shell_status(returncode):
    """A child's status as a shell reports it: a signal's as 128 + its number."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(number):
    try:
        return signal.Signals(number).name[3:]
    except ValueError:
        return str(number)


def start(settings):
    """Clear the last start's records and fork the supervisor; 0 once it recorded its pid, else 1."""
    files = settings["files"]
    _remove(files["exit"], files["pid"], files["stop"], files["ident"], files["keeper"])
    if _size(files["log"]):  # a run started again (`launch --run ID`) keeps the earlier attempts' log
        with open(files["log"], "rb") as old, open(files["earlier"], "ab") as earlier:
            earlier.write(old.read())
    open(files["log"], "w").close()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            supervise(settings)
        finally:
            os._exit(0)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if _size(files["pid"]):
            return 0
        time.sleep(0.1)
    print("fatpipe: the node process did not start", file=sys.stderr)
    return 1


def identity(pid):
    """`<boot id> <start time>` of process `pid`: who it is (runproc)."""
    return f"{runproc.boot_id()} {runproc.proc_stat(pid)[2]}"


def supervise(settings):
    files, log = settings["files"], settings["files"]["log"]
    me = os.getpid()
    ident = identity(me)
    _write(files["ident"], ident + "\n")  # who it is, before its pid
    _write(files["pid"], f"{me}\n")
    for sig in HANDLED:
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: exec gives torchrun the default
    tag = f"{runproc.AGENT_TAG_PREFIX}{me}-{ident.split()[1]}-"
    lighthouse = Lighthouse(settings, tag + LIGHTHOUSE_TAG)
    try:
        code = attempts(settings, tag, lighthouse)
    except Exception as e:  # nothing recorded: status reads the keeper's record, or "lost"
        note(log, f"the node's supervisor failed: {type(e).__name__}: {e}")
        raise
    finally:
        lighthouse.stop()
    _write(files["exit"], f"{code}\n")


def attempts(settings, tag, lighthouse):
    """Run the node's command until it ends for good; its last exit status (shell style)."""
    files, log, restarts = settings["files"], settings["files"]["log"], settings["restarts"]
    n = 0
    while True:
        code, sig = attempt(settings, tag, n, lighthouse)
        if os.path.exists(files["stop"]) or n >= restarts or leads(settings["leads"]) or sig is None:
            return code
        kill_tagged(tag + str(n))  # its workers (sessions of their own) outlive a killed torchrun
        n += 1
        note(log, f"torchrun on {settings['name']} ended by signal {signal_name(sig)}, not by "
                  f"fatpipe stop: starting it again (restart {n} of {restarts})")
        if settings["rejoin"]:
            rejoin(settings, log)


def attempt(settings, tag, n, lighthouse):
    """Attempt `n` through its keeper: (exit status, the signal that ended it, else None)."""
    files = settings["files"]
    _remove(files["keeper"])  # the last attempt's record is no longer the node's state
    lighthouse.tend(files["stop"])
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        failed = 1  # a keeper that could not run the command: the attempt failed, not a signal
        try:
            keep(settings, tag, n, supervisor)
            failed = 0
        except BaseException as e:
            note(files["log"], f"the attempt's keeper failed: {type(e).__name__}: {e}")
        finally:
            os._exit(failed)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        lighthouse.tend(files["stop"])
        time.sleep(TICK_S)
    record = runproc.Keeper(files["keeper"])
    if record.pid == pid and record.attempt == n and record.status is not None:
        code = int(record.status)
        return code, code - 128 if record.signalled else None
    # The keeper died before its child ended: what is left of the attempt goes, unrecorded, and
    # the keeper's end stands for the attempt's.
    kill_tagged(tag + str(n))
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status), os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def keep(settings, tag, n, supervisor):
    """The keeper of attempt `n`: record who it is, run the node's command, record its end; the
    node's end too when the supervisor is gone (nobody else would write it)."""
    files, me = settings["files"], os.getpid()
    head = f"{me} {n} {identity(me)}"
    _write(files["keeper"], head + "\n")
    env = dict(os.environ, **{runproc.AGENT_TAG_ENV: tag + str(n)})
    with open(files["log"], "ab") as out:
        returncode = subprocess.Popen(["bash", files["script"]], stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, env=env).wait()
    code = shell_status(returncode)
    orphaned = os.getppid() != supervisor  # reparented: the supervisor died while the attempt ran
    if orphaned:  # the node's end is whole (log, exit file) before any reader can see the status
        note(files["log"], f"the node's supervisor is gone: torchrun's status {code} is the "
                           "node's end (not started again)")
        _write(files["exit"], f"{code}\n")
    _write(files["keeper"], f"{head} {code} {'signal' if returncode < 0 else 'exit'}\n")
    if orphaned:
        kill_tagged(tag + LIGHTHOUSE_TAG, signal.SIGTERM)
        kill_tagged(tag + LIGHTHOUSE_TAG)


def leads(group_rank_file):
    """Whether torch made this node group rank 0 (its agent hosted the workers' store)."""
    if not group_rank_file:
        return False
    try:
        with open(group_rank_file) as f:
            return f.read().strip() == "0"
    except OSError:
        return False


def kill_tagged(tag, sig=signal.SIGKILL):
    """Signal every process that carries exactly `tag` (runproc checks each one's start time
    first), and wait a moment for them to go."""
    table = runproc.processes()
    pattern = re.compile(re.escape(f"{runproc.AGENT_TAG_ENV}={tag}"))
    left = {pid: table[pid][1] for pid in runproc.tagged(table, pattern)}
    for pid, started in left.items():
        runproc.signal_same(pid, started, sig)
    runproc.wait(lambda: not any(runproc.same(p, s) for p, s in left.items()), runproc.KILL_WAIT_S)


def python(settings):
    """The run's interpreter: FATPIPE_PYTHON on the node, else the run's."""
    return os.environ.get("FATPIPE_PYTHON") or settings["python"]


def rejoin(settings, log):
    """Copy the workers' store address into the next rendezvous rounds (noderun.REJOIN_PY) before
    a restarted torchrun starts."""
    try:
        with open(log, "ab") as out:
            done = subprocess.run([python(settings), "-c", *settings["rejoin"]], stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=settings["rejoin_timeout_s"])
        ok = done.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        note(log, "could not prepare the rendezvous for the new torchrun")


class Lighthouse:
    """Under live: the node's relay to the serving Lighthouse (and its own Lighthouse where the
    run has one there), beside torchrun for the whole run, started again a second after it
    dies; its lines go to the node's log. Nothing where the settings name none."""

    def __init__(self, settings, tag):
        self.args, self.log, self.tag = settings.get("lighthouse"), settings["files"]["log"], tag
        self.env = dict(os.environ, **{runproc.AGENT_TAG_ENV: tag})
        if settings.get("lighthouse_path"):  # the shipped trainer package (ssh nodes)
            self.env["PYTHONPATH"] = os.path.join(os.getcwd(), settings["lighthouse_path"])
        self.python, self.proc, self.died = python(settings), None, None

    def tend(self, stop_file):
        if not self.args or os.path.exists(stop_file):
            return
        if self.proc is not None and self.proc.poll() is not None and self.died is None:
            self.died = time.monotonic()
        if self.proc is None or (self.died is not None and time.monotonic() - self.died >= LIGHTHOUSE_AGAIN_S):
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen([self.python, "-m", *self.args], stdin=subprocess.DEVNULL,
                                             stdout=out, stderr=subprocess.STDOUT, env=self.env)
            self.died = None

    def stop(self):
        if self.proc is not None:
            kill_tagged(self.tag, signal.SIGTERM)
            kill_tagged(self.tag)
            self.proc.wait()


def main(argv):
    if argv[:1] != ["start"] or len(argv) != 2:
        print("usage: start SETTINGS_JSON", file=sys.stderr)
        return 2
    return start(json.loads(argv[1]))
