"""On a node: the process that runs one node's side of a run, restarts it under the run's policy
and records how it ended (docs/ARCHITECTURE.md, "Inside ops").

Standard library only, Python 3.8. `noderun.NodeRun.start_command` sends this file with runproc.py
as the program of `python3 -c`, run from the project folder, the run's settings as one JSON
argument (`start`). `start` clears the last start's files, keeps an earlier log beside the new one,
and forks the supervisor into a session of its own (stdin and output on /dev/null, so it outlives
the command that started it); it returns once the supervisor has recorded its pid.

The supervisor records who it is (`runproc`: boot id and start time in node-<rank>.ident) before
its pid (node-<rank>.pid), runs `bash node-<rank>.sh` (torchrun) with its output appended to
node-<rank>.log, and writes torchrun's exit status (a signal's as 128 + its number, as a shell
reports it) to node-<rank>.exit. It ignores TERM, INT and HUP, so when `runproc.stop` signals its
group it outlives torchrun (which shuts its workers down) and records torchrun's status.

A torchrun killed by a signal that `fatpipe stop` did not send (stop leaves the stop marker
first) is started again, up to the run's max_restarts times: its peers' agents see the new node
in the rendezvous and restart the whole worker group, which resumes from the checkpoint. Node 0's
is not (`restarts` 0): it hosts the rendezvous store, which died with it. Nor is the one torch
made group rank 0 (its group-rank file says 0): its agent hosted the store the workers share,
and the other agents would keep sending their workers to its old address. torchrun exits 1
after a TERM it handled, so its own "got signal" line in this attempt's log tells that case
apart. Each attempt's processes carry AGENT_TAG_ENV=<prefix><pid>-<start time>-<attempt>, since
its workers outlive a killed torchrun (each runs in a session of its own): they are killed
before the next attempt starts.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import runproc

START_WAIT_S = 10  # for the supervisor's pid file, once forked
GOT_SIGNAL = re.compile(r"SignalException: Process [0-9]* got signal: ([0-9A-Za-z.]*)")


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
        f.write(line + "\n")


def start(settings):
    """Clear the last start's files and fork the supervisor; 0 once it recorded its pid, else 1."""
    files = settings["files"]
    _remove(files["exit"], files["pid"], files["stop"], files["ident"])
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


def supervise(settings):
    files, log = settings["files"], settings["files"]["log"]
    pid = os.getpid()
    started = runproc.proc_stat(pid)[2]
    _write(files["ident"], f"{runproc.boot_id()} {started}\n")  # who it is, before its pid
    _write(files["pid"], f"{pid}\n")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: torchrun gets the default
    try:
        code = attempts(settings, f"{runproc.AGENT_TAG_PREFIX}{pid}-{started}-")
    except Exception as e:  # nothing recorded: status reads "lost", and the log says why
        note(log, f"fatpipe: the node's supervisor failed: {type(e).__name__}: {e}")
        raise
    _write(files["exit"], f"{code}\n")


def attempts(settings, tag_prefix):
    """Run torchrun until it ends for good; its last exit status."""
    files, log, restarts = settings["files"], settings["files"]["log"], settings["restarts"]
    n = 0
    while True:
        offset, tag = _size(log), f"{tag_prefix}{n}"
        code = run_once(files["script"], log, tag)
        if os.path.exists(files["stop"]) or n >= restarts or leads(settings["group_rank_file"]):
            return code
        sig = ended_by_signal(code, log, offset)
        if sig is None:
            return code
        kill_tagged(tag)
        n += 1
        note(log, f"fatpipe: torchrun on {settings['name']} ended by signal {sig}, not by fatpipe "
                  f"stop: starting it again (restart {n} of {restarts})")
        rejoin(settings, log)


def run_once(script, log, tag):
    """`bash script` with its output appended to `log`; its exit status as a shell reports it."""
    env = dict(os.environ, **{runproc.AGENT_TAG_ENV: tag})
    with open(log, "ab") as out:
        code = subprocess.Popen(["bash", script], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env).wait()
    return 128 - code if code < 0 else code


def leads(group_rank_file):
    """Whether torch made this node group rank 0 (its agent hosted the workers' store)."""
    try:
        with open(group_rank_file) as f:
            return f.read().strip() == "0"
    except OSError:
        return False


def ended_by_signal(code, log, offset):
    """The signal that ended torchrun (a name, or torchrun's own words), else None."""
    if 128 < code < 192:
        try:
            return signal.Signals(code - 128).name[3:]
        except ValueError:
            return str(code - 128)
    if code == 0:
        return None
    with open(log, "rb") as f:
        f.seek(offset)
        found = GOT_SIGNAL.findall(f.read().decode(errors="replace"))
    return found[-1] if found and found[-1] else None


def kill_tagged(tag):
    """Kill what is left of one attempt (its workers, in sessions of their own) and wait for it."""
    table = runproc.processes()
    left = {pid: table[pid][1] for pid in
            runproc.tagged(table, re.compile(re.escape(f"{runproc.AGENT_TAG_ENV}={tag}")))}
    for pid, started in left.items():
        runproc.signal_same(pid, started, signal.SIGKILL)
    runproc.wait(lambda: not any(runproc.same(p, s) for p, s in left.items()), runproc.KILL_WAIT_S)


def rejoin(settings, log):
    """Copy the workers' store address into the next rendezvous rounds (noderun.REJOIN_PY), with
    the run's interpreter, before a restarted torchrun starts."""
    python = os.environ.get("FATPIPE_PYTHON") or settings["python"]
    try:
        with open(log, "ab") as out:
            done = subprocess.run([python, "-c", *settings["rejoin"]], stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT,
                                  timeout=settings["rejoin_timeout_s"])
        ok = done.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        note(log, "fatpipe: could not prepare the rendezvous for the new torchrun")


def main(argv):
    return start(json.loads(argv[0]))
