"""`fatpipe train`: run the built-in trainer on this machine, through torchrun (standalone)."""

from __future__ import annotations

import glob
import shlex
import subprocess
import sys
from pathlib import Path

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.runs import mark_latest, new_run

from .options import Request, console, pass_project, pass_request, resolve_train

LOCAL = "_local"  # runs of `fatpipe train`: .fatpipe/_local/runs/<run-id>/ (no cluster name starts with _)


def default_nproc() -> int:
    """One process per GPU (a /dev/nvidiaN per GPU, counted without importing torch), else 1."""
    return len(glob.glob("/dev/nvidia[0-9]*")) or 1


def torchrun_command(trainer_args: list[str], run_dir: Path, nproc: int,
                     max_restarts: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
            "-m", "fatpipe.trainer", *trainer_args, "--out", str(run_dir)]


@pass_project(clusters_optional=True)
@pass_request
def train(project, request: Request, nproc_per_node, run_dir, max_restarts):
    """The body of `fatpipe train`; its options and help are declared in train_commands.py."""
    spec = resolve_train(project, request.overrides)
    if spec.data is not None and not Path(spec.data).exists():
        raise ConfigError(f"--data {spec.data}: no such file or folder")
    if run_dir:
        run_dir = Path(run_dir)
    else:
        run_id, run_dir = new_run(project, LOCAL)
        mark_latest(project, LOCAL, run_id)
    cmd = torchrun_command(spec.trainer_args(), run_dir, nproc_per_node or default_nproc(),
                           max_restarts)
    out = console(stderr=True)
    out.print(shlex.join(cmd), style="dim", markup=False, highlight=False)
    # Inherited stdout/stderr: the trainer's output streams as it comes (a live progress line
    # on a terminal), and Ctrl-C reaches torchrun, which stops its workers.
    proc = subprocess.Popen(cmd)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        code = proc.wait()
    out.print(f"results in {run_dir}", markup=False, highlight=False)
    sys.exit(code)
