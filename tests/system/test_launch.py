"""Launch on loopback nodes with real torchrun: streamed logs, worst exit status, Ctrl-C, reattach."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# A user's torchrun script: gloo all-reduce, then what the arguments ask for.
SCRIPT = """\
import datetime, os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
t = torch.ones(2) * (rank + 1)
dist.all_reduce(t)
# The pid file is whole before the line the test waits for is printed.
with open(f"worker-{rank}.pid.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(f"worker-{rank}.pid.tmp", f"worker-{rank}.pid")
print(f"rank {rank} of {dist.get_world_size()} sum={t[0].item():g} node={os.environ['FATPIPE_NODE_NAME']}", flush=True)
if "--sleep" in sys.argv:
    time.sleep(120)
held = time.monotonic() + 120
while "--hold" in sys.argv and not os.path.exists("go") and time.monotonic() < held:  # till the test says go
    time.sleep(0.1)
dist.destroy_process_group()
sys.exit(3 if f"--fail-rank={rank}" in sys.argv else 0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_cluster(folder: Path, n: int = 2, octet: int = 61) -> None:
    outputs = {
        "name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
        "rdzv_port": free_port(),
        "nodes": [{"name": f"demo-{i}", "private_ip": f"127.{octet}.0.{10 + i}", "transport": "local"}
                  for i in range(n)],
    }
    (folder / "outputs.json").write_text(json.dumps(outputs))
    (folder / "job.py").write_text(SCRIPT)


def latest_run(folder: Path) -> Path:
    runs = folder / ".fatpipe/demo/runs"
    return runs / (runs / "latest").read_text().strip()


def test_worst_status_and_prefixed_logs(run_cli, project_dir):
    write_cluster(project_dir)
    started = time.monotonic()
    result = run_cli("launch", "--outputs", "outputs.json", "--max-restarts", "0", "--timeout", "150",
                     "--", "job.py", "--fail-rank=1")
    print(f"launch took {time.monotonic() - started:.1f} s")
    # torchrun exits 1 when a worker fails; node 0, stopped after its peer failed, does not count.
    assert result.exit_code == 1, result.output
    assert "demo-0 | rank 0 of 2 sum=3 node=demo-0" in result.output
    assert "demo-1 | rank 1 of 2 sum=3 node=demo-1" in result.output
    run = latest_run(project_dir)
    # Node 0's worker succeeded, but its torchrun waits for the failed peer at the exit barrier.
    assert (run / "node-1.exit").read_text().strip() == "1"
    assert (run / "node-0.exit").exists()

    # `logs` of the failed run ends as the launch did: its failure line and its exit status.
    failure = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(failure) == 1 and "rank 1 on demo-1 failed first: exit status 3" in failure[0], result.output
    logs = run_cli("logs", "demo")
    assert logs.exit_code == 1 and "demo-1 | rank 1 of 2" in logs.output, logs.output
    assert [line for line in logs.output.splitlines() if line.startswith("error: ")] == failure, logs.output
    status = run_cli("status", "--json")
    nodes = json.loads(status.output)["run"]["nodes"]
    assert nodes["demo-1"] == "1" and nodes["demo-0"] not in ("running", "lost")


def test_detach_then_follow(run_cli, project_dir):
    write_cluster(project_dir, octet=62)
    # The run holds until the second launch has been refused: however slow the machine, it is live then.
    result = run_cli("launch", "--outputs", "outputs.json", "--max-restarts", "0", "--detach", "--", "job.py", "--hold")
    assert result.exit_code == 0 and "fatpipe logs demo -f" in result.output
    second = run_cli("launch", "--outputs", "outputs.json", "--", "job.py")
    (project_dir / "go").touch()
    assert second.exit_code == 1 and "still running on demo-0, demo-1" in second.output
    follow = run_cli("logs", "demo", "-f")
    assert follow.exit_code == 0, follow.output
    assert "demo-0 | rank 0 of 2" in follow.output and "demo-1 | rank 1 of 2" in follow.output
    run = latest_run(project_dir)
    assert [(run / f"node-{r}.exit").read_text().strip() for r in (0, 1)] == ["0", "0"]


def test_ctrl_c_stops_every_node(project_dir):
    write_cluster(project_dir, octet=63)
    env = {**os.environ, "COLUMNS": "200"}
    # No terminal here: a SIGINT stops the run only under --on-signal stop (else it detaches;
    # test_interrupt types a real Ctrl-C into a pty).
    fatpipe = [sys.executable, "-m", "fatpipe.cli", "launch", "--outputs", "outputs.json", "--on-signal", "stop",
               "--max-restarts", "0", "--timeout", "150", "--", "job.py", "--sleep"]
    proc = subprocess.Popen(fatpipe, cwd=project_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while sum("sum=3" in line for line in seen) < 2:
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(seen)
            seen.append(line)
        run = latest_run(project_dir)
        groups = [int((run / f"node-{r}.pid").read_text()) for r in (0, 1)]
        workers = [int((project_dir / f"worker-{r}.pid").read_text()) for r in (0, 1)]
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(seen) + rest
    assert "interrupted" in rest
    for pid in groups + workers:
        assert not alive(pid), f"process {pid} outlived Ctrl-C"
    assert all((run / f"node-{r}.exit").exists() for r in (0, 1))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][:1] != "Z"
