"""Each worker's first exception, in torchrun's per-rank error file (TORCHELASTIC_ERROR_FILE).

torchrun gives every worker its own error file (under `--log-dir`, which fatpipe points into the
run folder) and reads it back when the worker fails; `record` from torch's elastic errors writes
it. fatpipe's handler writes torch's format plus what the launcher needs to name the cause on one
line: the global rank, the node, the exception's type and message, the file it could not find
and a timestamp finer than torch's whole seconds (ops.run.rootcause reads them;
docs/ARCHITECTURE.md, "The run folder").
"""

from __future__ import annotations

import json
import os
import time
import traceback

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from fatpipe.node.env import NODE_NAME

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def error_record(error: BaseException) -> dict:
    """What fatpipe adds to torch's record: who raised what, when, and a missing file's name."""
    env = os.environ
    text = (str(error).splitlines() or [""])[0][:500]
    doc = {"rank": _int(env.get("RANK")), "local_rank": _int(env.get("LOCAL_RANK")),
           "node": env.get(NODE_NAME), "time": time.time(), "type": type(error).__name__, "text": text}
    if isinstance(error, OSError) and error.errno is not None:
        doc["errno"] = error.errno
    filename = getattr(error, "filename", None)  # OSError's, or trainer.config.ConfigError's
    if isinstance(filename, (str, bytes, os.PathLike)):
        doc["filename"] = os.fsdecode(filename)
    return doc


class RankErrorHandler(ErrorHandler):
    """torch's ErrorHandler, whose file also carries `error_record` under extraInfo.fatpipe."""

    def record_exception(self, e: BaseException) -> None:
        path = self._get_error_file_path()
        if not path:
            return
        data = {"message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {"py_callstack": "".join(traceback.format_exception(e)),
                          "timestamp": str(int(time.time())), "fatpipe": error_record(e)},
        }}
        try:
            with open(path, "w") as f:
                json.dump(data, f)
        except OSError:  # the report must never replace the error it reports
            pass


def _int(value: str | None) -> int | None:
    return int(value) if value and value.lstrip("-").isdigit() else None
