"""`fatpipe status [CLUSTER]`: is the cluster deployed, are its nodes ready, how is the latest run doing."""

from __future__ import annotations

import json

import click

from .options import cluster_argument, console, pass_project


@click.command()
@cluster_argument
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@pass_project
def status(project, cluster: str | None, as_json: bool):
    """Show the cluster's nodes (and whether each is ready) and the latest run's state."""
    from fatpipe.infra.errors import FatpipeError
    from fatpipe.infra.runs import load_outputs, outputs_file

    spec = project.cluster(cluster)
    doc: dict = {"cluster": spec.name, "provider": spec.provider, "tier": spec.tier, "deployed": False}
    if outputs_file(project, spec.name).exists():
        outputs = load_outputs(project, spec.name)
        doc["deployed"] = True
        doc["nodes"] = _node_states(project, outputs)
    try:
        doc["run"] = _run_state(project, spec.name)
    except FatpipeError:
        doc["run"] = None
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    _print(doc)


def _node_states(project, outputs) -> list[dict]:
    from fatpipe.ops.transport import fan_out, transports_for
    from fatpipe.ops.wait import check_node, declared_sysctls

    declared = declared_sysctls(outputs)
    transports = transports_for(outputs, project.state_dir(outputs.name))
    states = fan_out(lambda i: check_node(transports[i], outputs.nodes[i], declared, timeout=15),
                     list(range(len(outputs.nodes))))
    return [
        {"name": n.name, "transport": n.transport, "private_ip": n.private_ip, "public_ip": n.public_ip,
         "ready": s.ready, "state": s.reason}
        for n, s in zip(outputs.nodes, states, strict=True)
    ]


def _run_state(project, cluster: str) -> dict:
    from fatpipe.infra.defaults import SUMMARY_FILE
    from fatpipe.ops.noderun import node_states, run_nodes
    from fatpipe.ops.summary import read_json

    run_id, run_dir, nodes = run_nodes(project, cluster)
    states = node_states(nodes)
    summary = read_json(run_dir / SUMMARY_FILE) or None
    return {"id": run_id, "dir": str(run_dir), "nodes": dict(zip([n.name for n in nodes], states, strict=True)),
            "summary": summary}


def _print(doc: dict) -> None:
    from rich.table import Table

    out = console()
    head = f"[bold]{doc['cluster']}[/] ({doc['provider']}, tier {doc['tier']})"
    if not doc["deployed"]:
        out.print(f"{head}: not deployed (fatpipe up {doc['cluster']})")
    else:
        table = Table(title=head, title_justify="left")
        for column in ("node", "transport", "private ip", "public ip", "state"):
            table.add_column(column)
        for n in doc["nodes"]:
            state = f"[green]{n['state']}[/]" if n["ready"] else f"[yellow]{n['state']}[/]"
            table.add_row(n["name"], n["transport"], n["private_ip"], n["public_ip"] or "-", state)
        out.print(table)
    run = doc["run"]
    if not run:
        out.print("no runs yet")
        return
    states = ", ".join(f"{name}: {_state(s)}" for name, s in run["nodes"].items())
    out.print(f"latest run [bold]{run['id']}[/]: {states}")
    summary = run["summary"]
    if summary:
        out.print(f"  final loss {summary.get('final_loss', '?')}, "
                  f"{summary.get('tokens_per_s', 0):,.0f} tokens/s, {summary.get('steps', '?')} steps")


def _state(value: str) -> str:
    if value.lstrip("-").isdigit():
        return "exit 0" if value == "0" else f"[red]exit {value}[/]"
    return value
