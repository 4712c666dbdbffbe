"""`fatpipe pull [CLUSTER] PATH... [--node NAME | --all] [--to DIR] [--force]`: bring what a
user's script wrote on the nodes (its checkpoints, in its own folder) into the local project."""

from __future__ import annotations

from pathlib import Path

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.runspec import pull_path
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.leader import latest_leader
from fatpipe.ops.run.pullpaths import ask_sizes, sources_of
from fatpipe.ops.run.pullpaths import copy_from_node as fetch

from .options import console, pass_project


@pass_project
def pull(project, names, node_names, all_nodes, to, force, outputs_file):
    """The body of `fatpipe pull`; its options and help are declared in run_commands.py."""
    cluster, paths = split_cluster(project, names)
    rels = [pull_path(p) for p in paths]
    if all_nodes and node_names:
        raise ConfigError("give --node or --all, not both")
    resolved = Cluster.resolve(project, cluster)
    outputs = resolved.load_outputs(outputs_file)
    sources = pick_nodes(sources_of(resolved.deployed(outputs)), node_names, all_nodes, outputs.name,
                         latest_leader(resolved))
    base = Path(to).absolute() if to else project.root
    per_node = all_nodes or len(sources) > 1
    out = console()
    ask_sizes(sources, rels)  # every path measured on every node: one call per node
    for source in sources:
        for rel in rels:
            dest = base / source.name / rel if per_node else base / rel
            with out.status(f"{source.name}: {rel}") as status:
                got = fetch(source, rel, dest, replace=force,
                            progress=lambda line, s=status, r=rel, n=source.name: s.update(f"{n}: {r}  {line}"))
            out.print(got.line(project.root), markup=False, soft_wrap=True)


def split_cluster(project, names: tuple[str, ...]) -> tuple[str | None, list[str]]:
    """(cluster, paths): the first argument is the cluster when it names one and paths follow."""
    if len(names) > 1 and names[0] in project.clusters:
        return names[0], list(names[1:])
    if len(names) == 1 and names[0] in project.clusters:
        raise ConfigError(f"name what to pull from {names[0]}: `fatpipe pull {names[0]} out/ckpt.pt`")
    return None, list(names)


def pick_nodes(sources, node_names, all_nodes: bool, cluster: str, leader: str | None = None):
    """The `leader` (the node that ran rank 0; node 0 when it is None or not a node now), the named
    nodes (in the order given) or every node; an unknown name is refused."""
    if all_nodes:
        return sources
    if not node_names:
        return [next((s for s in sources if s.name == leader), sources[0])] if sources else []
    by_name = {s.name: s for s in sources}
    unknown = [n for n in node_names if n not in by_name]
    if unknown:
        raise ConfigError(f"{cluster} has no node {unknown[0]!r}; its nodes: {', '.join(by_name)}")
    return [by_name[n] for n in dict.fromkeys(node_names)]
