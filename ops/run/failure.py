"""Why a run failed, in one line that names the node and the phase, from what its nodes left in
the run folder.

In order: the first error of the last attempt that is no consequence of another, else of the newest
earlier attempt that has one (ops.run.rootcause: each worker's torchrun error file, and torchrun's
report of a worker that exited without one), with why a missing file was not copied to an ssh node
(ops.env.notcopied); the trainer's faults.json (each failed attempt with its phase, step and the
nodes whose ranks never reported the failure: cut off or dead), torchrun's rendezvous errors in the
node logs, and last the nodes that failed on their own with their exit status.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from fatpipe.infra.defaults import FAULTS_FILE
from fatpipe.infra.runinfo import last_record

from ..env.nodeenv import ENV_FILE
from ..env.notcopied import not_copied_hint
from ..rdzv.noderun import LaunchResult
from ..rdzv.rendezvous import Rendezvous
from .rootcause import WorkerError, cause_line, run_cause
from .summary import read_json

# What torchrun's agent raises when the nodes never all meet (or the rendezvous was closed).
RENDEZVOUS_ERRORS = ("RendezvousTimeoutError", "RendezvousClosedError")
_MISSING = re.compile(r"No such file or directory:? '?([^']+)'?")  # ENOENT as text, e.g. from C++
_TORCH_INIT = re.compile(r'File ".*[/\\]torch[/\\]__init__\.py", line \d+, in <module>')  # torch's import itself
_ERROR_LINE = re.compile(r"^(?:\S+ \| )?([\w.]*(?:Error|Exception)): (\S.*)$")


def describe_failure(result: LaunchResult, rdzv: Rendezvous, since: float,
                     project_root: Path | None = None) -> str | None:
    """The one line to show for a run that failed on its own (not stopped, not timed out);
    `since` is when the launch started (epoch seconds): older failures in the folder are not it.
    With `project_root`, a file missing on an ssh node that exists here is explained."""
    if result.ok or result.interrupted or result.timed_out:
        return None
    own = [c for n, c in result.exit_codes.items() if c != 0 and n not in result.stopped]
    if result.unknown and not own:
        return None  # nothing failed that fatpipe saw: the run goes on where it could not look
    line = _describe(result, rdzv, since, project_root)
    away = [n for n, state in result.unknown.items() if state == "unreachable"]
    if line and away:
        line += f"; {', '.join(away)} could not be reached: its end is unknown"
    return line


def _describe(result: LaunchResult, rdzv: Rendezvous, since: float, project_root: Path | None) -> str | None:
    cause, errors, attempt = run_cause(Path(result.run_dir), [n.name for n in rdzv.nodes])
    if cause:
        hint = _missing_file_hint(cause, rdzv, project_root) or _no_cuda_hint(cause, Path(result.run_dir))
        when = (f" (attempt {attempt + 1} of {rdzv.max_restarts + 1}; the restarts after it "
                "ended in connection errors only)" if attempt is not None else "")
        return cause_line(cause, errors, when) + (f"; {hint}" if hint else "")
    lost = [name for name, code in result.exit_codes.items() if code is None and name not in result.stopped]
    if lost:
        return _lost_line(lost, errors, Path(result.run_dir))
    failure = last_failure(Path(result.run_dir), since)
    if failure:
        return _trainer_failure(failure, rdzv)
    names = [n.name for n in rdzv.nodes]
    logs = {name: _log(result.run_dir, rank) for rank, name in enumerate(names)}
    broken = next(((n, e) for n in names if (e := torch_import_error(logs[n]))), None)
    if broken:  # torchrun imports torch first: the node never started, its peers only waited for it
        return f"{broken[0]}: torch does not import there ({broken[1]}); the run never started on it"
    waited = [n for n in names if any(e in logs[n] for e in RENDEZVOUS_ERRORS)]
    if waited:
        return (f"the run failed at the rendezvous: torchrun on {', '.join(waited)} gave up waiting "
                f"for all {len(names)} nodes to join (join timeout {rdzv.join_timeout_s} s)")
    # A node fatpipe stopped (after another failed, or `fatpipe stop`) is never the cause.
    failed = {n: c for n, c in result.exit_codes.items() if c and n not in result.stopped}
    if not failed:
        return None
    name, code = next(iter(failed.items()))
    cause = _last_error(logs.get(name, ""))
    return f"{name} failed first: {_status(code)}" + (f" ({cause})" if cause else "")


def _lost_line(lost: list[str], errors: list[WorkerError], run_dir: Path) -> str:
    """`n-1 was lost after step 80: ...`: a node whose processes vanished without recording an
    exit status (killed, out of memory, rebooted), with the last step the run recorded."""
    step = last_record(run_dir).get("step")
    when = f" after step {step}" if isinstance(step, int) else " before the run recorded a step"
    also = f" (and {', '.join(lost[1:])})" if len(lost) > 1 else ""
    line = (f"{lost[0]}{also} was lost{when}: its processes vanished without recording an exit "
            "status (killed, out of memory or rebooted)")
    followed = sorted({e.node for e in errors if e.consequence} - set(lost))
    if followed:
        line += f"; the connection errors on {', '.join(followed)} followed from it"
    return line


def last_failure(run_dir: Path, since: float = 0.0) -> dict | None:
    """The latest failure the trainer described in faults.json, if it happened after `since`."""
    failures = read_json(run_dir / FAULTS_FILE).get("failures")
    if not isinstance(failures, list) or not failures or not isinstance(failures[-1], dict):
        return None
    last = failures[-1]
    return last if float(last.get("time") or 0) >= since else None


def _trainer_failure(failure: dict, rdzv: Rendezvous) -> str:
    phase, step = failure.get("phase", "unknown"), failure.get("step")
    where = f"{phase} at step {step}" if step is not None else phase
    attempt, allowed = int(failure.get("attempt") or 1), rdzv.max_restarts + 1
    tries = f"attempt {attempt} of {allowed}" + (", no restarts left" if attempt >= allowed else "")
    silent = failure.get("silent_nodes") or []
    who = (f"{', '.join(silent)} stopped answering (its link or its process went down)" if silent
           else "every node saw it fail")
    error = failure.get("error")
    return f"the run failed in {where} ({tries}): {who}" + (f"; the error: {error}" if error else "")


def _missing_file_hint(cause: WorkerError, rdzv: Rendezvous, project_root: Path | None) -> str | None:
    """Why the file a worker could not find is missing on its ssh node, when it exists here."""
    node = next((n for n in rdzv.nodes if n.name == cause.node), None)
    if project_root is None or node is None or node.transport != "ssh":
        return None  # sim nodes share this machine's files: nothing was left behind
    filename = cause.filename
    if filename is None and (cause.type == "FileNotFoundError" or "No such file" in cause.text):
        m = _MISSING.search(cause.text)
        filename = m.group(1) if m else None
    return not_copied_hint(filename, project_root, node.workdir) if filename else None


_CUDA_TEXT = re.compile(r"cuda|nvidia|nccl", re.I)


def _no_cuda_hint(cause: WorkerError, run_dir: Path) -> str | None:
    """A script that asks for a GPU on nodes whose torch has none (env.json, ops.env.nodeenv)."""
    if not _CUDA_TEXT.search(f"{cause.type} {cause.text}"):
        return None
    node = read_json(run_dir / ENV_FILE).get("nodes", {}).get(cause.node)
    if not isinstance(node, dict) or node.get("cuda") or not node.get("torch"):
        return None
    return (f"{cause.node} has no CUDA (torch {node['torch']}): run the script on CPU "
            "(its device \"cpu\", the gloo backend, DDP without device_ids)")


def torch_import_error(log: str) -> str:
    """The error a traceback through torch's own `__init__.py` ended with (torch that does not
    import: torchrun's or a worker's first line), else ""."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if _TORCH_INIT.search(line):
            return _last_error("\n".join(lines[i:i + 200]).split("\nTraceback", 1)[0])
    return ""


def _log(run_dir: Path, rank: int) -> str:
    try:
        return (Path(run_dir) / f"node-{rank}.log").read_text(errors="replace")
    except OSError:
        return ""


def _last_error(log: str) -> str:
    """The last `SomeError: message` line of a node's log, the message cut to one short line."""
    for line in reversed(log.splitlines()):
        m = _ERROR_LINE.match(line.strip())
        if m:
            return f"{m.group(1).rpartition('.')[2]}: {m.group(2)[:200]}"
    return ""


def _status(code: int | None) -> str:
    if code is None:
        return "its process was lost"
    if code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exit status {code}"
