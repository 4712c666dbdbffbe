"""netcheck over the ssh transport (a real sshd on 127.0.0.1, two "remote" nodes): the benchmark is
shipped with fatpipe.trainer, runs from the node's copy, and its result comes back through the log."""

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
    # The node ran the copy of fatpipe.trainer shipped to it, fatpipe.node beside it.
    assert (sshd / "remote" / "demo-0" / ".fatpipe/pkg/fatpipe/trainer/net/bench.py").exists()
    assert (sshd / "remote" / "demo-0" / ".fatpipe/pkg/fatpipe/node/env.py").exists()
    [path] = list((project_dir / ".fatpipe/demo/runs").glob("*/netcheck.json"))
    doc = json.loads(path.read_text())
    assert doc["world_size"] == 2 and doc["nnodes"] == 2 and doc["busbw_size"] == 1 << 20
    [pair] = doc["p2p"]["pairs"]
    assert (pair["server"], pair["client"]) == ("demo-0", "demo-1") and pair["best_gbps"] > 0
    assert (path.parent / "netcheck" / "node-1.log").exists()  # fetched back from the node
