"""netcheck --quick over the ssh transport (a real sshd on 127.0.0.1, two "remote" nodes): the check
is a standard-library program sent on each ssh command's input, nothing is shipped or installed
first, and its result comes back through node 0's output."""

from __future__ import annotations

import json
import sys

import pytest

from .conftest import free_port, ssh_outputs


@pytest.mark.slow
def test_netcheck_over_ssh(sshd, run_cli, project_dir):  # noqa: F811
    (project_dir / "outputs.json").write_text(json.dumps(ssh_outputs(free_port())))
    result = run_cli("netcheck", "--outputs", "outputs.json", "--remote-python", sys.executable,
                     "--quick", "--max-size", "1M", "--p2p-tool", "socket", "--no-gate")
    assert result.exit_code == 0, result.output
    assert "p2p TCP to demo-0 (socket" in result.output
    # Nothing shipped: no trainer package, no venv, no project folder on either node.
    assert not [p for node in ("demo-0", "demo-1") for p in (sshd / "remote" / node).rglob("*")
                if ".fatpipe" in p.parts]
    [path] = list((project_dir / ".fatpipe/demo/runs").glob("*/netcheck.json"))
    doc = json.loads(path.read_text())
    assert doc["world_size"] == 2 and doc["nnodes"] == 2 and doc["busbw_size"] == 1 << 20 and doc["backend"] == "tcp"
    [pair] = doc["p2p"]["pairs"]
    assert (pair["server"], pair["client"]) == ("demo-0", "demo-1") and pair["best_gbps"] > 0
    assert "ring of TCP sockets" in (path.parent / "netcheck" / "node-0.log").read_text()  # its lines, kept here
