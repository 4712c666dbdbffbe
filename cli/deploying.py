"""The deploy step `deploy` and `up` share, and the engine's log that `down` shows too: apply the
cluster's stack, asking on the terminal before paid resources and before nodes are replaced. Apart
from the run steps (cli/steps.py) so a command that deploys or destroys imports no run machinery.
"""

from __future__ import annotations

import sys

import click
from rich.markup import escape

from fatpipe.ops.data.nodeholdings import change_lines
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.reach.hostkeys import deploy_forgetting_recreated
from fatpipe.stacks.engine import deploy_cluster

from .options import console


def terraform_log(verbose: bool):
    """Echo engine output to stderr: every line with -v, else only what names a resource, and
    fatpipe's own lines about the deployment."""
    err = console(stderr=True)

    def log(line: str) -> None:
        if verbose or ": Creation complete" in line or ": Destruction complete" in line \
                or "Apply complete" in line or "Destroy complete" in line or line.startswith("fatpipe: "):
            err.print(line, style="dim", markup=False, soft_wrap=True)

    return log


def approve_node_changes(cluster: Cluster, changes, replace: bool) -> bool:
    """`replace_option`'s question: one line per node the plan would replace, destroy or stop and
    start (stacks.nodeplan), then yes with --replace, else the user's answer on a terminal alone."""
    out = console()
    for line in change_lines(cluster, changes):
        out.print(f"[yellow]{escape(line)}[/]", soft_wrap=True)
    if replace:
        return True
    if not sys.stdin.isatty():
        return False
    return click.confirm(f"Apply this to {cluster.name}? What these nodes hold is lost", default=False, err=True)


def deploy_outputs(cluster, engine: str, yes: bool, verbose: bool, replace: bool = False):
    """Apply the cluster's stack, asking on the terminal before paid resources and before existing
    nodes are replaced, destroyed or stopped (unless `replace`); its outputs. The host keys of the
    nodes it recreated are forgotten (`ops.reach.hostkeys`)."""
    return deploy_forgetting_recreated(cluster, lambda: deploy_cluster(
        cluster.project, cluster.spec, engine=engine, yes=yes,
        confirm=lambda question: click.confirm(question, default=False, err=True),
        log=terraform_log(verbose), approve=lambda changes: approve_node_changes(cluster, changes, replace)))
