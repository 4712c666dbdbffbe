"""An `ssh` on PATH that logs each session before it runs the real one: what the round-trip test
(tests/system/test_round_trips.py) and bench/roundtrips.py count a command's round trips with.

A session is a `transfer` (it carries rsync's server), a launch's `start` of its node process
(the node's supervisor), the project push's `push-record` (written before the copy:
ops/env/projectsync.py), a follower's `follow` stream, or a `check`: everything else, the node
program's calls among them.
"""

from __future__ import annotations

import shutil
import stat
from collections import Counter
from pathlib import Path

LOG_ENV, REAL_ENV = "FATPIPE_COUNT_SSH_LOG", "FATPIPE_COUNT_REAL_SSH"
SCRIPT = f"""#!/bin/bash
host=; prev=
for a in "$@"; do [ "$prev" = "--" ] && [ -z "$host" ] && host=$a; prev=$a; done
case "$*" in
  *"rsync --server"*) kind=transfer ;;
  *FATPIPE_NODECALL*) kind=check ;;
  *"' commit "*) kind=push-record ;;
  *"def supervise("*) kind=start ;;
  *"-F --pid"*) kind=follow ;;
  *) kind=check ;;
esac
printf '%s\\t%s\\n' "${{host:-?}}" "$kind" >> "${LOG_ENV}"
exec "${REAL_ENV}" "$@"
"""


def install(folder: Path) -> dict[str, str]:
    """Put the counting `ssh` in `folder` (made); the environment that routes ssh through it,
    with its log in `folder`, to add to a command's (PATH first)."""
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "ssh"
    wrapper.write_text(SCRIPT)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return {LOG_ENV: str(folder / "sessions.log"), REAL_ENV: shutil.which("ssh") or "ssh", "PREPEND_PATH": str(folder)}


def sessions(env: dict[str, str]) -> Counter:
    """{(host, kind): sessions} logged so far; the log is emptied."""
    log = Path(env[LOG_ENV])
    found = Counter(tuple(line.split("\t", 1)) for line in log.read_text().splitlines()) if log.exists() else Counter()
    log.write_text("")
    return found


def most_per_node(found: Counter, kind: str = "check") -> int:
    """The most sessions of `kind` any one node got."""
    per_host: Counter = Counter()
    for (host, k), n in found.items():
        if k == kind:
            per_host[host] += n
    return max(per_host.values(), default=0)
