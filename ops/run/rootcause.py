"""The first error of a failed run's last attempt: which rank raised what, on which node.

Every worker's first exception is in its torchrun error file, in the run folder on its node
(`torchrun/node-<rank>/`, pulled back with the run; trainer.errorfile writes them, for user
scripts through trainer.api.userscript). A worker that exits non-zero without an exception leaves
none; torchrun's own report in the node log (ChildFailedError: `rank`, `exitcode`,
`error_file: <N/A>`) names it. Errors of the connection kind that follow a rank's failure (gloo's
connectFullMesh, a refused or reset connection, the store or the rendezvous gone) are
consequences: the cause is the earliest other error, else the earliest non-zero exit; with
nothing but consequences this names nothing (ops.run.failure then reads faults.json and the logs).
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.defaults import TORCHRUN_DIR

# What a worker raises when another one has gone: the group, the store or the rendezvous with it.
CONSEQUENCE_TYPES = frozenset({
    "DistNetworkError", "DistStoreError", "DistBackendError", "RendezvousClosedError",
    "RendezvousTimeoutError", "RendezvousConnectionError", "ConnectionError",
    "ConnectionRefusedError", "ConnectionResetError", "ConnectionAbortedError", "BrokenPipeError",
    "TimeoutError",
})
# A RuntimeError of gloo or NCCL about the link (the words trainer.faults counts a failed
# collective by): what the ranks still alive see once one is gone.
_CONSEQUENCE_TEXT = re.compile(
    r"connectFullMesh|connection|broken pipe|timed out|timeout|socket|peer|pair closure"
    r"|remote process exited|communicator was aborted|\bgloo\b|\bnccl\b", re.I)
_FAILURE = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:[^\n]*\n\s*rank\s*:\s*(?P<rank>\d+)[^\n]*\n"
    r"\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*\n\s*error_file\s*:\s*(?P<file>\S+)")


@dataclass
class WorkerError:
    """One worker's failure: an exception (from its error file) or an exit without one."""

    rank: int | None
    node: str
    type: str  # the exception's type; "" for an exit without one
    text: str
    time: float
    exitcode: int | None = None
    filename: str | None = None  # an OSError's file (FileNotFoundError: the missing one)
    errno: int | None = None

    @property
    def consequence(self) -> bool:
        if self.type in CONSEQUENCE_TYPES:
            return True
        return self.type in ("RuntimeError", "DistError") and bool(_CONSEQUENCE_TEXT.search(self.text))

    def who(self) -> str:
        return f"rank {self.rank} on {self.node}" if self.rank is not None else self.node

    def what(self) -> str:
        if not self.type:
            return f"exit status {self.exitcode}, without a Python exception"
        return f"{self.type}: {self.text}" if self.text else self.type


def attempt_files(run_dir: Path, rank: int) -> dict[int, list[Path]]:
    """A node's error files by attempt number, from torchrun's newest run folder of the node."""
    base = Path(run_dir) / TORCHRUN_DIR / f"node-{rank}"
    sessions = sorted((p for p in base.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not sessions:
        return {}
    return {int(p.name.rpartition("_")[2]): sorted(p.glob("*/error.json"))
            for p in sessions[-1].glob("attempt_*") if p.name.rpartition("_")[2].isdigit()}


def read_error_file(path: Path, node: str) -> WorkerError | None:
    """A worker's error file: fatpipe's record in it, else torch's plain `Type: message`."""
    try:
        message = json.loads(path.read_text(errors="replace"))["message"]
        extra = message.get("extraInfo") or {}
        mine = extra.get("fatpipe") or {}
        if mine:
            return WorkerError(mine.get("rank"), mine.get("node") or node, str(mine.get("type", "")),
                               str(mine.get("text", "")), float(mine.get("time") or 0),
                               filename=mine.get("filename"), errno=mine.get("errno"))
        kind, _, text = str(message.get("message", "")).partition(": ")
        return WorkerError(None, node, kind, (text.splitlines() or [""])[0][:500],
                           float(extra.get("timestamp") or 0))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def exits_in_log(log: str, node: str) -> list[WorkerError]:
    """Workers torchrun reported as failed without an error file, from its last report in the log."""
    report = log.rpartition("ChildFailedError")[2] if "ChildFailedError" in log else ""
    found = []
    for m in _FAILURE.finditer(report):
        code = int(m["code"])
        if m["file"] != "<N/A>" or code == 0:
            continue
        try:
            when = datetime.datetime.strptime(m["time"], "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            when = 0.0
        found.append(WorkerError(int(m["rank"]), node, "", "", when, exitcode=code))
    return found


def worker_errors(run_dir: Path, node_names: list[str], attempt: int | None = None) -> list[WorkerError]:
    """Every worker failure of one attempt (default: each node's last), node by node (rank =
    node index); torchrun's report in the log, which names exits without a file, is the last's."""
    errors: list[WorkerError] = []
    for rank, node in enumerate(node_names):
        files = attempt_files(run_dir, rank)
        chosen = attempt if attempt is not None else max(files, default=None)
        errors += [e for e in (read_error_file(p, node) for p in files.get(chosen, [])) if e]
        if attempt is None:
            try:
                log = (Path(run_dir) / f"node-{rank}.log").read_text(errors="replace")
            except OSError:
                log = ""
            errors += exits_in_log(log, node)
    return errors


def run_cause(run_dir: Path, node_names: list[str]) -> tuple[WorkerError | None, list[WorkerError], int | None]:
    """The cause of a failed run: the last attempt's, else (its workers saw only the connection
    errors a restart that cannot meet gives) the newest earlier attempt's; with that attempt's
    number when it was not the last, since restarts repeat a script's own error or hide it."""
    errors = worker_errors(run_dir, node_names)
    cause = first_cause(errors)
    if cause:
        return cause, errors, None
    seen = sorted({a for rank in range(len(node_names)) for a in attempt_files(run_dir, rank)})
    for attempt in reversed(seen[:-1]):
        earlier = worker_errors(run_dir, node_names, attempt)
        cause = first_cause(earlier)
        if cause:
            return cause, earlier, attempt
    return None, errors, None


def first_cause(errors: list[WorkerError]) -> WorkerError | None:
    """The earliest exception that is no consequence, else the earliest exit with a status > 0."""
    order = lambda e: (e.time, e.rank if e.rank is not None else 1 << 30)  # noqa: E731
    raised = [e for e in errors if e.type and not e.consequence]
    if raised:
        return min(raised, key=order)
    exited = [e for e in errors if not e.type and (e.exitcode or 0) > 0]
    return min(exited, key=order) if exited else None


def cause_line(cause: WorkerError, errors: list[WorkerError], when: str = "") -> str:
    """`rank 1 on n-1 failed first: ValueError: ...`, with what the other ranks did after it;
    `when` (e.g. which attempt) follows "first"."""
    line = f"{cause.who()} failed first{when}: {cause.what()}"
    others = [e for e in errors if e is not cause and not e.consequence and (e.type or (e.exitcode or 0) > 0)]
    if others:
        line += f"; {len(others)} other rank(s) failed too ({', '.join(sorted({e.node for e in others}))})"
    followed = sorted({e.node for e in errors if e.consequence})
    if followed:
        line += f"; the connection errors on {', '.join(followed)} followed from it"
    return line
