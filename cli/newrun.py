"""Opening a run, shared by `rendezvous`, `launch` and `up`: its id and folder, its rendezvous written.
Apart from the run steps (cli/steps.py) so `rendezvous` imports no launch machinery.
"""

from __future__ import annotations

from fatpipe.infra.runs import new_run
from fatpipe.ops.rdzv.rendezvous import RunOptions, new_rendezvous

from .options import Request, resolve_train


def open_run(cluster, request: Request, train=None, script=None, run=None):
    """A new run (or the given (id, folder)) with its rendezvous written; returns (rdzv, run_dir).

    `train`, `script` and the run options default to the request's [train] overrides,
    `-- SCRIPT ARGS` and torchrun flags.
    """
    project = cluster.project
    train = train if train is not None else resolve_train(project, request.overrides)
    script = script if script is not None else list(request.script)
    run_id, run_dir = run or new_run(project, cluster.name)
    try:
        rdzv = new_rendezvous(cluster, run_id, run_dir, train=train, script=script,
                              options=RunOptions(**request.run_options))
    except BaseException:
        if run is None and not any(run_dir.iterdir()):  # refused before writing anything: no clutter
            run_dir.rmdir()
        raise
    return rdzv, run_dir
