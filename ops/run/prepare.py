"""Get ssh nodes ready for a run: ship the project, the run folder and the trainer; make the venvs.

Sim nodes share this machine's files and interpreter and need none of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import REMOTE_VENV
from fatpipe.infra.nodevenv import node_venv, venv_stamp

from ..data.check import data_excludes
from ..env.projectsync import push_project
from ..env.shipped import SYNC_EXCLUDES, shipped_packages
from ..env.venvs import build_node_envs
from ..rdzv.noderun import NodeRun
from ..reach.asknode import drop_kept
from ..reach.cluster import Cluster
from ..reach.projectdir import claim_project_dir
from .sync import push_run


def pulled_excludes(project) -> tuple[str, ...]:
    """rsync patterns, anchored at the project folder, for the paths `[run] pull` brings back."""
    return tuple(f"/{path}" for path in project.spec.run.pull)




def pushed_folders(node: NodeRun) -> tuple[str, ...]:
    """The folders inside the node's project folder that a launch pushes into."""
    return (node.rdzv.run_rel, *(dest for _, dest in shipped_packages()))


def push_excludes(cluster: Cluster, node: NodeRun) -> tuple[str, ...]:
    """What the project push leaves out for `node`: never shipped, the staged data, what `[run]
    pull` brings back, the run folder."""
    # The staged dataset is `fatpipe data push`'s, and what `[run] pull` brings back is the node's:
    # never shipped again, never deleted. Nor is the run folder, nor anything a run wrote
    # (ops.env.projectsync deletes only what an earlier push sent and this project no longer has).
    excludes = SYNC_EXCLUDES + data_excludes(cluster.data) + pulled_excludes(cluster.project)
    return (*excludes, f"/{node.rdzv.run_rel}/")


def prepare_node(cluster: Cluster, node: NodeRun, run_dir: Path, gpus: int) -> None:
    """Ship the project, the run's inputs and the trainer package to an ssh node (its Python:
    prepare_envs, then the ops.env.nodeenv probe)."""
    t, plan, project, log = node.transport, node.plan, cluster.project, cluster.log
    if t.shares_fs:
        return
    # Never another's folder; once it is this project's, the folders the pushes fill are made with
    # it (in the command's first call: ops/run/checks.py), so no push asks for them again.
    claim_project_dir(t, plan.workdir, node.rdzv.cluster, project.project_id, pushed_folders(node))
    started = time.monotonic()
    pushed = push_project(t, project.root, plan.workdir, push_excludes(cluster, node), made=True)
    for line in pushed.lines():
        log(f"{node.name}: {line}")
    if not pushed.copied:
        log(f"{node.name}: the project folder is in place, nothing to copy ({time.monotonic() - started:.1f} s)")
    else:
        drop_kept(t)  # what the node answered of its environment may differ with the new files
        log(f"{node.name}: copy the project folder ({time.monotonic() - started:.1f} s)")
    steps: list[tuple[str, Callable[[], object]]] = [
        # The run's inputs only: what the node made there (checkpoints, logs, metrics) stays.
        ("copy the run's inputs", lambda: push_run(node, run_dir, True)),
    ]
    # Every run: the built-in trainer is the package, and a script may import fatpipe.trainer.api;
    # fatpipe.node travels with it (the trainer reads the node's environment through it).
    steps.append(("copy the trainer", lambda: push_packages(t, plan.workdir)))
    # A given interpreter (an image that ships torch) is not checked here: the node environment
    # probe (ops.env.nodeenv) names a node without torch, and the run one whose torch does not import.
    for what, step in steps:
        started = time.monotonic()
        result = step()
        if not result.ok:
            raise FatpipeError(f"{t.describe()}: {what} failed: {result.reason()}")
        log(f"{node.name}: {what} ({time.monotonic() - started:.1f} s)")


def push_packages(t, workdir: str):
    """The packages a node runs from REMOTE_PKG into its project folder (made by the claim)."""
    for src, dest in shipped_packages():
        result = t.push(src, f"{workdir}/{dest}", SYNC_EXCLUDES, made=True)
        if not result.ok:
            break
    return result


def prepare_envs(cluster: Cluster, nodes: list[NodeRun], gpus: int) -> None:
    """The venvs of the nodes that run in fatpipe's venv, from one download (ops/env/venvs.py)."""
    built = [n for n in nodes if not n.transport.shares_fs and n.plan.python == f"{REMOTE_VENV}/bin/python"]
    if built:
        project, log = cluster.project, cluster.log
        venv = node_venv(project, cluster.spec, gpus)  # its cluster's [node], resolved
        build_node_envs(built, venv, venv_stamp(project.root, venv), log)
