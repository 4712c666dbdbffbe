"""`fatpipe status [CLUSTER]`: is the cluster deployed, are its nodes ready, how is the latest run doing."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from fatpipe.infra.defaults import SUMMARY_FILE
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runinfo import read_json_object, run_info
from fatpipe.infra.runs import load_outputs, outputs_file
from fatpipe.ops.rdzv.noderun import node_states, run_nodes
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.reach.transport import fan_out
from fatpipe.ops.reach.wait import check_node, declared_sysctls
from fatpipe.ops.run.checks import ask_status_checks
from fatpipe.ops.run.progress import with_live_progress

from .options import console, pass_project
from .results import node_gone


@pass_project
def status(project, cluster: str | None, as_json: bool):
    """The body of `fatpipe status`; its options and help are declared in run_commands.py."""
    cluster = Cluster.resolve(project, cluster)  # its node answers serve every step below
    spec = cluster.spec
    doc: dict = {"cluster": spec.name, "provider": spec.provider, "tier": spec.tier, "deployed": False}
    try:
        if outputs_file(project, spec.name).exists():
            cluster = cluster.deployed(load_outputs(project, spec.name))
            doc["deployed"] = True
            ask_status_checks(cluster)  # one call per node
            doc["nodes"] = _node_states(cluster)
        try:
            doc["run"] = _run_state(cluster)
        except FatpipeError as e:
            doc["run"] = None
            if e.exit_code != 1:  # not "no runs yet": a run fatpipe cannot read, which the user must hear
                doc["run_error"] = str(e)
    finally:
        cluster.answers.forget_all()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    _print(doc)


def _node_states(cluster) -> list[dict]:
    outputs = cluster.outputs
    declared = declared_sysctls(outputs)
    transports = cluster.transports()
    states = fan_out(lambda i: check_node(transports[i], outputs.nodes[i], declared, timeout=15),
                     list(range(len(outputs.nodes))))
    return [
        {"name": n.name, "transport": n.transport, "private_ip": n.private_ip, "public_ip": n.public_ip,
         "ready": s.ready, "state": s.reason}
        for n, s in zip(outputs.nodes, states, strict=True)
    ]


def _run_state(cluster) -> dict:
    """The run's state per node: its recorded exit status where the folder holds one, else what
    the node says (unless it is gone: a sim node after `down`)."""
    run_id, run_dir, nodes = run_nodes(cluster)
    info = run_info(run_dir, size=False)
    pending = [n for n in nodes if f"node-{n.plan.rank}" not in info.exits and not node_gone(n)]
    asked = dict(zip([n.name for n in pending], node_states(pending), strict=True))
    info.running = "running" in asked.values()
    live = None if not nodes or node_gone(nodes[0]) else with_live_progress(info, nodes)
    states = {}
    for node in nodes:
        key = f"node-{node.plan.rank}"
        if key in info.exits:
            states[node.name] = "unreadable exit file" if info.exits[key] is None else str(info.exits[key])
        else:
            states[node.name] = asked.get(node.name, "no exit recorded (node gone)")
    return {"id": run_id, "dir": str(run_dir), "nodes": states, "outcome": info.outcome,
            "last_step": info.last_step, "final_loss": info.final_loss,
            "summary": read_json_object(run_dir / SUMMARY_FILE) or (live or {}).get("summary")}


def _print(doc: dict) -> None:
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
        out.print(f"[red]{escape(doc['run_error'])}[/]" if doc.get("run_error") else "no runs yet", highlight=False)
        return
    states = ", ".join(f"{name}: {_state(s)}" for name, s in run["nodes"].items())
    out.print(f"latest run [bold]{run['id']}[/]: {states}")
    summary = run["summary"]
    if summary:
        out.print(f"  final loss {summary.get('final_loss', '?')}, "
                  f"{summary.get('tokens_per_s') or 0:,.0f} tokens/s, {summary.get('steps', '?')} steps")
    elif run["last_step"] is not None:
        loss = f", loss {run['final_loss']:.4f}" if isinstance(run["final_loss"], (int, float)) else ""
        out.print(f"  last step {run['last_step']}{loss} (no summary: the run did not finish)")


def _state(value: str) -> str:
    if value.lstrip("-").isdigit():
        return "exit 0" if value == "0" else f"[red]exit {value}[/]"
    return value
