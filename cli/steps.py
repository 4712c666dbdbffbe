"""The steps several commands share, each with its progress on the terminal: deploy, wait, rendezvous,
netcheck, train. A command calls these; it never imports another command's module.
"""

from __future__ import annotations

import click

from .options import console, given_run_options, overrides, resolve_train, script_args
from .render import exit_table, log_sink, netcheck_tables, note


def terraform_log(verbose: bool):
    """Echo engine output to stderr: every line with -v, else only what names a resource."""
    err = console(stderr=True)

    def log(line: str) -> None:
        if verbose or ": Creation complete" in line or ": Destruction complete" in line \
                or "Apply complete" in line or "Destroy complete" in line:
            err.print(line, style="dim", markup=False, soft_wrap=True)

    return log


def deploy_outputs(project, name: str | None, engine: str, yes: bool, verbose: bool):
    """Apply the cluster's stack, asking on the terminal before paid resources; its outputs."""
    from fatpipe.stacks.engine import deploy_cluster

    return deploy_cluster(project, name, engine=engine, yes=yes,
                          confirm=lambda question: click.confirm(question, default=False, err=True),
                          log=terraform_log(verbose))


def wait_ready(project, outputs, timeout_s: float, out):
    """Wait with a live summary line; returns the final per-node states."""
    from fatpipe.ops.wait import wait_for_nodes

    with out.status(f"waiting for {len(outputs.nodes)} node(s)") as status:
        def update(states):
            ready = sum(s.ready for s in states)
            pending = next((f"{s.name}: {s.reason}" for s in states if not s.ready), "")
            status.update(f"{ready}/{len(states)} node(s) ready {pending}")

        return wait_for_nodes(project, outputs, timeout_s=timeout_s, on_update=update)


def require_ready(states, timeout_s: float) -> None:
    """Raise naming every node that is not ready, with its reason."""
    from fatpipe.infra.errors import FatpipeError

    late = [s for s in states if not s.ready]
    if late:
        reasons = "\n  ".join(f"{s.name}: {s.reason}" for s in late)
        raise FatpipeError(f"{len(late)} node(s) not ready after {timeout_s:g} s:\n  {reasons}")


def new_rendezvous(project, outputs, train=None, script=None, run=None):
    """A new run (or the given (id, folder)) with its rendezvous written; returns (rdzv, run_dir).

    `train`, `script` and the run options default to this command's [train] overrides,
    `-- SCRIPT ARGS` and torchrun flags.
    """
    from fatpipe.infra.runs import new_run
    from fatpipe.ops.rendezvous import make_rendezvous

    train = train if train is not None else resolve_train(project, overrides())
    script = script if script is not None else script_args()
    run_id, run_dir = run or new_run(project, outputs.name)
    rdzv = make_rendezvous(project, outputs, run_id, run_dir, train=train, script=script,
                           options=given_run_options())
    return rdzv, run_dir


def run_netcheck(project, outputs, options, out, run_dir=None, sink=None, remote_python=None):
    """Run the link check, print its tables (also when the gate fails) and where it wrote them."""
    from fatpipe.ops.netcheck import NetcheckFailed
    from fatpipe.ops.netcheck import run_netcheck as measure

    try:
        doc = measure(project, outputs, run_dir=run_dir, options=options, log=note(out), sink=sink,
                      remote_python=remote_python)
    except NetcheckFailed as e:
        netcheck_tables(e.doc, out)
        raise
    netcheck_tables(doc, out)
    return doc


def run_training(project, outputs, rdzv, run_dir, out, timeout_s=None, detach=False):
    """Launch `rdzv`, print every node's log, then the exit table; returns the LaunchResult."""
    from fatpipe.ops.launch import launch as launch_run

    names = [n.name for n in rdzv.nodes]
    result = launch_run(
        project, rdzv, run_dir, sink=log_sink(out, names), log=note(out), timeout_s=timeout_s,
        detach=detach,
    )
    if detach:
        out.print(f"run {rdzv.run_id} started; follow it with: fatpipe logs {outputs.name} -f")
        return result
    out.print(exit_table(result))
    if result.interrupted:
        out.print("[yellow]interrupted[/]: the run was stopped on every node")
    elif result.timed_out:
        out.print(f"[red]timed out[/] after {timeout_s:g} s: the run was stopped on every node")
    out.print(f"logs and results in {run_dir}", markup=False)
    return result
