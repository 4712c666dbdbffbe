"""On a node: a run's progress as `ops/run/progress.py` reads it, in one step of the node program.

Standard library only, Python 3.8; run from the project folder by `call.py`, beside
`runproc` (the run's state). The answer is the text `progress.parse_progress` reads: the
metrics file's size and tail, summary.json, the run's state and the group rank the node recorded.
"""

import os
import sys


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def progress_text(sep, metrics, tail_bytes, summary, group_rank, *state_files):
    """Metrics size and tail, summary, state (runproc.status of `state_files`) and group rank,
    separated by `sep`."""
    try:
        size = os.path.getsize(metrics)
        with open(metrics, "rb") as f:
            f.seek(max(0, size - int(tail_bytes)))
            tail = f.read().decode(errors="replace")
    except OSError:
        size, tail = 0, ""
    state = sys.modules["runproc"].status(*state_files)
    return sep.join([f"{size}\n{tail}", _read(summary), state + "\n", _read(group_rank)])
