"""The ssh transport against a real sshd on a loopback port: rendezvous, launch and logs through it.

The test starts `sshd -D` on 127.0.0.1 with a generated host key and user key; two "remote"
nodes are this machine reached over ssh, each with its own project folder
(FATPIPE_REMOTE_DIR with {node}) and private IP, running this interpreter (--remote-python,
the option for images that ship torch) instead of building a venv.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from .conftest import free_port, ssh_outputs

JOB = """\
import datetime, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum={t[0].item():g} cwd={os.path.basename(os.getcwd())} "
      f"iface={os.environ['GLOO_SOCKET_IFNAME']} args={sys.argv[1:]}", flush=True)
dist.destroy_process_group()
"""


def test_transport_and_known_hosts(sshd, tmp_path):
    from fatpipe.ops.reach.transport import SshTransport

    t = SshTransport("n0", "127.0.0.1", tmp_path / "state" / "known_hosts")
    done = t.run("echo $((6 * 7)); echo to-stderr >&2")
    assert done.ok and done.stdout == "42\n", done.stderr
    assert "127.0.0.1" in (tmp_path / "state" / "known_hosts").read_text()  # accept-new recorded it
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("hello")
    (src / ".venv").mkdir()
    (src / ".venv" / "big").write_text("never shipped")
    assert t.push(src, str(sshd / "pushed"), [".venv"]).ok
    assert (sshd / "pushed" / "sub" / "a.txt").read_text() == "hello"
    assert not (sshd / "pushed" / ".venv").exists()
    assert t.pull(str(sshd / "pushed" / "sub"), tmp_path / "back").ok
    assert (tmp_path / "back" / "a.txt").read_text() == "hello"


@pytest.mark.slow
def test_rendezvous_launch_and_logs_over_ssh(sshd, run_cli, project_dir):
    (project_dir / "outputs.json").write_text(json.dumps(ssh_outputs(free_port())))
    (project_dir / "job.py").write_text(JOB)
    (project_dir / ".venv").mkdir()  # never shipped
    common = ["--outputs", "outputs.json", "--max-restarts", "0", "--remote-python", sys.executable]

    result = run_cli("rendezvous", *common, "--", "job.py", "a")
    assert result.exit_code == 0, result.output
    run_id = (project_dir / ".fatpipe/demo/runs/latest").read_text().strip()
    assert "--local-addr 127.0.0.11" in (project_dir / f".fatpipe/demo/runs/{run_id}/node-1.sh").read_text()

    started = time.monotonic()
    result = run_cli("launch", "demo", "--run", run_id, "--outputs", "outputs.json", "--timeout", "150")
    print(f"launch over ssh: {time.monotonic() - started:.1f} s")
    assert result.exit_code == 0, result.output
    assert "demo-0 | rank 0 sum=3 cwd=demo-0 iface=lo args=['a']" in result.output
    assert "demo-1 | rank 1 sum=3 cwd=demo-1 iface=lo args=['a']" in result.output
    remote = sshd / "remote"
    assert (remote / "demo-1" / "job.py").exists() and not (remote / "demo-1" / ".venv").exists()
    run_dir = project_dir / ".fatpipe/demo/runs" / run_id
    assert (run_dir / "node-1.log").exists()  # fetched back from the node

    logs = run_cli("logs", "demo")
    assert logs.exit_code == 0 and "demo-1 | rank 1 sum=3" in logs.output
    follow = run_cli("logs", "demo", "-f", "--node", "demo-0")
    assert follow.exit_code == 0 and "demo-0 | rank 0 sum=3" in follow.output


@pytest.mark.slow
def test_builtin_trainer_over_ssh(sshd, run_cli, project_dir):
    (project_dir / "outputs.json").write_text(json.dumps(ssh_outputs(free_port())))
    result = run_cli("launch", "--outputs", "outputs.json", "--max-restarts", "0", "--remote-python",
                     sys.executable, "--timeout", "200", "--preset", "tiny", "--steps", "4",
                     "--batch-size", "2", "--seq-len", "32", "--comm", "none")
    assert result.exit_code == 0, result.output
    run_id = (project_dir / ".fatpipe/demo/runs/latest").read_text().strip()
    # The trainer ran from the copy shipped to the node, and its results came back.
    assert (sshd / "remote" / "demo-0" / ".fatpipe/pkg/fatpipe/trainer/__main__.py").exists()
    summary = json.loads((project_dir / ".fatpipe/demo/runs" / run_id / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["world_size"] == 2
