"""torchrun on a node, whose end says how it ended: `python -m fatpipe.trainer.agent MODULE ARGS`
runs MODULE (torch.distributed.run) as `python -m MODULE ARGS` would, except that a signal
torchrun handled (it stops its workers, then raises SignalException, and would exit 1 like any
failure) ends this process by that very signal.

So the node's supervisor (node/supervisor.py) reads a stop or a kill from the exit status
alone, never from the log that the user's script writes too (docs/ARCHITECTURE.md, "A run lives
on its nodes").
"""

from __future__ import annotations

import logging
import os
import runpy
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException


def end_by(sig: int) -> None:
    """End this process by `sig`, as if torchrun had not handled it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is not to end the process


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m fatpipe.trainer.agent MODULE [ARGS...]")
    module = sys.argv.pop(1)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SignalException as e:
        end_by(int(e.sigval))


if __name__ == "__main__":
    main()
