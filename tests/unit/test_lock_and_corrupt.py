"""One command at a time changes a cluster (the lock under .fatpipe/<cluster>/), read-only commands
still answer; a truncated or corrupt state file is one line naming it and the fix, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.project import load_project, project_id_at
from fatpipe.infra.runs import cluster_lock

LOCAL = {"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
         "isolation": "loopback", "nodes": []}


def deployed(project_dir, nodes: int = 4) -> dict:
    """outputs.json of the default `demo` cluster on local nodes that answer ready."""
    doc = json.loads(json.dumps(LOCAL))
    for i in range(nodes):
        ready = project_dir / f"ready-{i}.json"
        ready.write_text(json.dumps({"iface": "lo", "mtu": 65536, "namespaced": []}))
        doc["nodes"].append({"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local",
                             "ready_file": str(ready)})
    path = project_dir / ".fatpipe" / "demo" / "outputs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return doc


def test_a_second_holder_is_refused_with_who_holds_it(project_dir):
    project = load_project()
    with cluster_lock(project, "demo", "up"):
        with pytest.raises(FatpipeError, match=r"cluster demo is busy: `fatpipe up` \(pid \d+"):
            with cluster_lock(project, "demo", "deploy"):
                pass
    with cluster_lock(project, "demo", "deploy"):  # released on the way out
        pass


def test_changing_commands_refuse_while_another_process_holds_the_cluster(project_dir, run_cli):
    deployed(project_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom fatpipe.infra.project import load_project\n"
         "from fatpipe.infra.runs import cluster_lock\n"
         "with cluster_lock(load_project(), 'demo', 'up --down-after'):\n"
         "    print('held', flush=True); time.sleep(60)\n"],
        cwd=project_dir, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for command in (["deploy"], ["down"], ["up"], ["launch"], ["netcheck"], ["runs", "prune", "--keep", "1"]):
            result = run_cli(*command)
            assert result.exit_code == 1, (command, result.output)
            assert f"busy: `fatpipe up --down-after` (pid {holder.pid}" in result.output, result.output
        for command in (["status"], ["config"], ["runs"], ["logs"]):
            result = run_cli(*command)
            assert "busy" not in result.output, (command, result.output)
        assert run_cli("status").exit_code == 0 and run_cli("runs").exit_code == 0
    finally:
        holder.kill()
        holder.wait(timeout=10)


CORRUPT = [b"", b'{"name": "demo", "nodes": [', b"[]", b"\xff\xfe\x00", b'{"cluster": 5}',
           b'{"name": "demo"}', b'{"cluster": {"value": "x"}}']


@pytest.mark.parametrize("content", CORRUPT, ids=range(len(CORRUPT)))
def test_a_corrupt_outputs_file_is_one_line_exit_2(project_dir, run_cli, content):
    path = project_dir / ".fatpipe" / "demo" / "outputs.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    for command in (["status"], ["wait"], ["launch"], ["netcheck"], ["rendezvous"]):
        result = run_cli(*command)
        assert result.exit_code == 2, (command, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: unreadable"), result.output
        assert "`fatpipe deploy demo` writes it again" in lines[0]


def test_a_corrupt_netcheck_up_would_reuse_is_one_line_exit_2(project_dir, run_cli):
    deployed(project_dir)
    time.sleep(0.05)
    bad = project_dir / ".fatpipe" / "demo" / "runs" / "20250101-000000-aaaa" / "netcheck.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"gate": {"passed": tr')
    result = run_cli("up")
    assert result.exit_code == 2, result.output
    assert f"{bad}: unreadable (not JSON" in " ".join(result.output.split()) and "Traceback" not in result.output


def test_a_corrupt_project_id_is_refused_never_replaced(project_dir):
    path = project_dir / ".fatpipe" / "project-id"
    first = project_id_at(project_dir)
    assert project_id_at(project_dir) == first and len(first) == 8
    path.write_text("12ab")  # truncated
    with pytest.raises(ConfigError, match="holds no project id"):
        project_id_at(project_dir)
    assert path.read_text() == "12ab"
    assert project_id_at(project_dir / "elsewhere", create=False) is None
