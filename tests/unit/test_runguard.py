"""A node out of reach may be running the cluster's run: every command that asks "is a run going on"
(deploy, data push, launch, netcheck) refuses in one line naming it, and `--force` goes on; a node
no longer deployed as the run knew it holds no run (ops/run/guard.py).

The nodes are real ssh transports to a closed port of this machine: out of reach at once."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runs import mark_latest, new_run
from fatpipe.ops.rdzv.rendezvous import new_rendezvous
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.guard import refuse_if_running, run_going, still_deployed


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once it is closed


def cut_off_run(project_dir, port: int):
    """The `demo` cluster deployed as two ssh nodes this machine cannot reach, and a run on them
    marked the latest; (project, outputs, run id)."""
    doc = {"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
           "nodes": [{"name": f"demo-{i}", "private_ip": f"10.42.0.{10 + i}", "transport": "ssh",
                      "ssh_host": "127.0.0.1", "ssh_port": port} for i in range(2)]}
    path = project_dir / ".fatpipe" / "demo" / "outputs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    project, outputs = load_project(), parse_outputs(doc)
    run_id, run_dir = new_run(project, "demo")
    new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir)
    mark_latest(project, "demo", run_id)
    return project, outputs, run_id


GUARDED = [["deploy"], ["data", "push"], ["launch"], ["netcheck"]]


@pytest.mark.parametrize("command", GUARDED, ids=" ".join)
def test_a_node_out_of_reach_may_be_running_the_run(project_dir, run_cli, command):
    _, _, run_id = cut_off_run(project_dir, closed_port())
    result = run_cli(*command)
    assert result.exit_code == 1, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(error) == 1 and error[0].startswith("Error: demo-0, demo-1 could not be reached ("), \
        result.output
    assert f"run {run_id} may still be going there" in error[0] and "--force goes on" in error[0], error[0]
    assert "`fatpipe stop demo` ends it" in error[0]


def test_force_goes_on_past_a_node_out_of_reach(project_dir, run_cli):
    cut_off_run(project_dir, closed_port())
    result = run_cli("data", "push", "--force")  # goes on to what comes next: no [data] declared here
    assert "may still be going there; going on (--force)" in result.output, result.output
    assert "--force goes on" not in result.output


def test_a_node_no_longer_deployed_holds_no_run(project_dir):
    project, outputs, run_id = cut_off_run(project_dir, closed_port())
    with pytest.raises(FatpipeError, match="may still be going there"):
        refuse_if_running(Cluster.resolve(project, "demo"))
    going = run_going(Cluster.resolve(project, "demo"))
    assert going.run_id == run_id and going.running == [] and list(going.unreachable) == ["demo-0", "demo-1"]
    # Made again elsewhere (a new address), or destroyed: nothing of the run can be there.
    moved = outputs.model_copy(update={"nodes": [n.model_copy(update={"ssh_port": n.ssh_port + 1})
                                                 for n in outputs.nodes]})
    assert refuse_if_running(Cluster.resolve(project, "demo", moved)) is None
    (project_dir / ".fatpipe" / "demo" / "outputs.json").unlink()
    assert run_going(Cluster.resolve(project, "demo")) is None


def test_a_netns_node_whose_namespace_is_gone_holds_no_run(project_dir):
    node = SimpleNamespace(name="n0", plan=SimpleNamespace(transport="netns", netns="fp-never-made-0"))
    outputs = SimpleNamespace(nodes=[SimpleNamespace(name="n0", transport="netns", netns="fp-never-made-0")])
    assert not still_deployed(node, outputs)
    assert not still_deployed(node, None)


def test_a_node_that_answers_without_the_runs_folder_holds_no_run():
    from fatpipe.ops.run.guard import holds_no_run

    # A rendezvous made but never launched: the node answers, its run folder is not there.
    assert holds_no_run("unreadable: FileNotFoundError: [Errno 2] No such file or directory: 'p/demo-0'")
    assert holds_no_run("0") and holds_no_run("-15") and holds_no_run("lost")
    assert not holds_no_run("unreachable: ssh: connect to host 10.0.0.5 port 22: Connection refused")
    assert not holds_no_run("unreadable: PermissionError: [Errno 13] Permission denied")
