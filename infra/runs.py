"""Run ids, run folders under .fatpipe/<cluster>/runs/, the cluster's outputs file and its lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from pathlib import Path

from .defaults import RENDEZVOUS_FILE
from .errors import FatpipeError
from .files import write_atomic
from .outputs import read_outputs

LATEST = "latest"  # a text file beside the run folders holding the newest launched run's id
LOCK_FILE = "lock"  # .fatpipe/<cluster>/lock: held by every command that changes the cluster
CORRUPT = 2  # the exit status for a state file fatpipe cannot read: like a usage error, the user acts


def outputs_file(project, cluster_name: str) -> Path:
    """`.fatpipe/<cluster>/outputs.json`, the deploy step's result (docs/ARCHITECTURE.md, "Where state lives")."""
    return project.state_dir(cluster_name) / "outputs.json"


def load_outputs(project, cluster_name: str, path: str | os.PathLike | None = None):
    """The cluster's outputs: an explicit file if given, else the one deploy wrote.

    A file that is there but unreadable (truncated, edited, not fatpipe's) is one line naming it
    and the fix, exit 2: never a traceback.
    """
    file = Path(path) if path else outputs_file(project, cluster_name)
    if not file.exists():
        return read_outputs(file, cluster_name)  # its own "deploy the cluster first"
    fix = (f"`fatpipe deploy {cluster_name}` writes it again from the deployment's state" if not path
           else "give an outputs file written by `fatpipe deploy` or `terraform output -json`")
    try:
        return read_outputs(file, cluster_name)
    except FatpipeError as e:
        why = str(e).removeprefix(f"{file}: ").splitlines()[0]
        raise FatpipeError(f"{file}: unreadable ({why}); {fix}", exit_code=CORRUPT) from None
    except (UnicodeDecodeError, ValueError, TypeError, AttributeError) as e:
        raise FatpipeError(f"{file}: unreadable ({type(e).__name__}); {fix}", exit_code=CORRUPT) from None


def new_run_id() -> str:
    """A sortable, unique id usable as a torchrun --rdzv-id: UTC time plus 4 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def runs_dir(project, cluster_name: str) -> Path:
    return project.state_dir(cluster_name) / "runs"


def run_dir(project, cluster_name: str, run_id: str) -> Path:
    return runs_dir(project, cluster_name) / run_id


def new_run(project, cluster_name: str) -> tuple[str, Path]:
    """Make a fresh run folder and return its id and path.

    It becomes the latest only once launched (`mark_latest`): a failed netcheck, a refused
    second `up` or a missing script must not hide the last run that trained.
    """
    run_id = new_run_id()
    path = run_dir(project, cluster_name, run_id)
    path.mkdir(parents=True)
    return run_id, path


def latest_run_id(project, cluster_name: str) -> str | None:
    """The run `runs/latest` names, or None."""
    try:
        found = (runs_dir(project, cluster_name) / LATEST).read_text(errors="replace").strip()
    except OSError:
        return None
    return found or None


def mark_latest(project, cluster_name: str, run_id: str | None) -> None:
    """Make `run_id` the run that status, logs and stop mean by default (None: forget the mark)."""
    marker = runs_dir(project, cluster_name) / LATEST
    if run_id is None:
        marker.unlink(missing_ok=True)
    else:
        write_atomic(marker, run_id + "\n")


def newest_run_with_logs(project, cluster_name: str) -> str | None:
    """The newest run folder holding a rendezvous and node logs (ids sort by time); without any,
    the newest holding a rendezvous (written by `fatpipe rendezvous`, not launched yet)."""
    base = runs_dir(project, cluster_name)
    if not base.is_dir():
        return None
    runs = [p for p in sorted(base.iterdir(), key=lambda p: p.name, reverse=True)
            if p.is_dir() and (p / RENDEZVOUS_FILE).is_file()]
    with_logs = [p for p in runs if any(p.glob("node-*.log"))]
    found = with_logs or runs
    return found[0].name if found else None


def find_run(project, cluster_name: str, run_id: str | None = None) -> tuple[str, Path]:
    """An existing run by id, or the latest one; a clear error when there is none.

    Without an id: the run `latest` names, else (a marker lost, or left by an older fatpipe on a
    run that never trained) the newest run that has logs.
    """
    base = runs_dir(project, cluster_name)
    if run_id is None:
        run_id = latest_run_id(project, cluster_name)
        if run_id is None or not (base / run_id / RENDEZVOUS_FILE).is_file():
            run_id = newest_run_with_logs(project, cluster_name)
        if run_id is None:
            raise FatpipeError(f"cluster {cluster_name} has no runs yet (fatpipe launch {cluster_name})")
    path = base / run_id
    if not (path / RENDEZVOUS_FILE).exists():
        known = sorted(p.parent.name for p in base.glob(f"*/{RENDEZVOUS_FILE}")) if base.exists() else []
        hint = f"; recent runs: {', '.join(known[-5:])}" if known else ""
        raise FatpipeError(f"no run {run_id} for cluster {cluster_name}{hint}", exit_code=2)
    check_rendezvous(path / RENDEZVOUS_FILE)
    return run_id, path


def check_rendezvous(path: Path) -> None:
    """Raise (exit 2, naming the file and the fix) when a rendezvous.json cannot be what fatpipe wrote."""
    doc, why = read_json_checked(path)
    if why is None and (not isinstance(doc.get("nodes"), list) or "run_id" not in doc):
        why = "not a fatpipe rendezvous"
    if why is not None:
        raise FatpipeError(f"{path}: unreadable ({why}); this run cannot be followed or stopped: "
                           f"start a new one (`fatpipe launch`), and remove the folder "
                           f"(`fatpipe runs prune`) when done with it", exit_code=CORRUPT)


def read_json_checked(path: Path) -> tuple[dict, str | None]:
    """(the JSON object in `path`, None), or ({}, why it is not one: missing, cut short, ...)."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}, "missing"
    except UnicodeDecodeError:
        return {}, "not text"
    except json.JSONDecodeError as e:
        return {}, f"not JSON: {e.msg} at line {e.lineno}"
    except OSError as e:
        return {}, e.strerror or str(e)
    return (doc, None) if isinstance(doc, dict) else ({}, "not a JSON object")


def json_problem(path: Path) -> str | None:
    """Why `path` is not a readable JSON object (None: it is one)."""
    return read_json_checked(path)[1]


# --- one command at a time changes a cluster ----------------------------------------------------


@contextlib.contextmanager
def cluster_lock(project, cluster_name: str, command: str):
    """Hold `.fatpipe/<cluster>/lock` while `command` changes the cluster; refuse when another does.

    An flock: the kernel drops it when the holder exits however it exits, so a crash leaves
    no stale lock. The file says who holds it, for the refusal's message. Yields a function that
    lets the lock go early (a live launch's follow changes nothing: ops/run/launch.py).
    """
    path = project.state_dir(cluster_name) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another fatpipe command"
            raise FatpipeError(
                f"cluster {cluster_name} is busy: {holder} is changing it; wait for it to end "
                f"(status, logs, config and runs work meanwhile), or end that command first"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"`fatpipe {command}` (pid {os.getpid()}, since "
                f"{time.strftime('%H:%M:%S', time.localtime())})\n")
        f.flush()

        def release() -> None:
            if not f.closed:
                f.truncate(0)
                f.close()  # the flock goes with the file

        try:
            yield release
        finally:
            release()
