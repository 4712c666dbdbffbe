"""`python -m fatpipe.trainer.api.userscript SCRIPT ARGS` (or `-m MODULE ARGS`): run a user's torchrun
script as `python SCRIPT ARGS` would, with its first exception in torchrun's per-rank error file,
and end it without Python's finalization (trainer.exiting says why).

torchrun writes no error file for a worker that does not apply `record` itself, so the launcher
would know only an exit status; every user script runs through this instead. The script keeps
its `__main__` semantics: `__name__ == "__main__"`, `sys.argv` as given, its folder first on
sys.path (runpy, as the interpreter does).
"""

from __future__ import annotations

import os
import runpy
import sys

from ..errorfile import ERROR_FILE_ENV, RankErrorHandler
from ..exiting import end_script, run_and_exit
from ..noderank import record_group_rank


def run(argv: list[str]) -> int:
    record_group_rank()  # before the script runs (it may chdir): which node is rank 0's (ops.run.leader)
    if os.environ.get(ERROR_FILE_ENV):  # torchrun's path is relative: the script may chdir
        os.environ[ERROR_FILE_ENV] = os.path.abspath(os.environ[ERROR_FILE_ENV])
    if not argv:
        raise SystemExit("usage: python -m fatpipe.trainer.api.userscript SCRIPT [ARGS] | -m MODULE [ARGS]")
    if argv[0] in ("-m", "--module"):
        if len(argv) < 2:
            raise SystemExit("python -m fatpipe.trainer.api.userscript: -m needs a module")
        sys.argv = [argv[1], *argv[2:]]  # runpy sets argv[0] to the module's file
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


def main() -> None:
    RankErrorHandler().initialize()  # as torch's `record` does: a fatal signal's traceback
    run_and_exit(lambda: run(sys.argv[1:]), end=end_script)  # the first exception in the error file


if __name__ == "__main__":
    main()
