"""How a trainer process ends: its exit status, without Python's finalization once torch has run.

gloo's worker threads outlive destroy_process_group: its backend has no shutdown, and the threads
are joined only when the last reference to the group goes (DDP holds one). Such a thread may
still be releasing the last collective's tensors, which takes the GIL. A thread that asks for the
GIL while the interpreter finalizes is ended with pthread_exit, and that unwinding through a C++
destructor (noexcept) calls std::terminate: "terminate called without an active exception",
SIGABRT, exit -6 after a run that had finished (seen on a loaded machine, where the thread waits
for a CPU while the main thread exits). So once torch.distributed is loaded the process flushes
and ends with os._exit: there is no finalization to meet. Everything the run wrote is closed
before (metrics, TensorBoard, checkpoints and summary are written atomically). A user's script
ends the same way under trainer.api.userscript, after what Python's exit runs first (its threads
joined, its atexit handlers): a DDP comm hook written in Python makes the race likelier, since
gloo's thread then also drops the hook's callbacks, each taking the GIL.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from .lazy import load


def exit_process(code: int) -> NoReturn:
    """Flush the logs and standard streams, then end the process with `code` at once."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code)


def record_error(error: BaseException) -> None:
    """Under torchrun, the exception into this worker's error file, which names the cause of a
    failed run (trainer.errorfile)."""
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        load("fatpipe.trainer.errorfile").RankErrorHandler().record_exception(error)


_BEFORE_JOIN: list[Callable[[], None]] = []


def stop_before_join(stop: Callable[[], None]) -> None:
    """`stop` runs when a script ends, before end_script waits for its threads: what fatpipe
    started that keeps a thread that is no daemon (torchft's Manager: its quorum executor)."""
    _BEFORE_JOIN.append(stop)


def end_script(code: int) -> NoReturn:
    """A user's script has ended: first what Python's own exit would run while the interpreter
    lives (fatpipe's own threads stopped, wait for the script's non-daemon threads, then its
    atexit handlers, fatpipe's summary among them), then exit_process."""
    while _BEFORE_JOIN:
        _BEFORE_JOIN.pop()()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    exit_process(code)


def run_and_exit(main: Callable[[], int], end: Callable[[int], NoReturn] = exit_process) -> NoReturn:
    """Run an entry point's main() and exit with its status through `end`; an exception goes to
    sys.excepthook (a script's run records it there: trainer.api) and exits 1."""
    try:
        code = main()
    except SystemExit as e:  # argparse's usage errors, sys.exit() inside main
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException as e:  # noqa: BLE001 - reported here, since the process ends without finalization
        sys.excepthook(type(e), e, e.__traceback__)
        record_error(e)
        code = 1
    if "torch.distributed" not in sys.modules:  # a bad flag: torch never loaded, a normal exit
        sys.exit(code)
    end(code)
