"""`fatpipe up` end to end on sim clusters: exit 0, a summary with loss and sync latency, nothing left.

Each test runs the real command (terraform apply of the sim stack, netcheck, torchrun) in a
subprocess with a timeout, on a cluster named for the test so it cannot meet another's nodes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_or_fail

from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runs import new_run
from fatpipe.ops.rdzv.rendezvous import new_rendezvous
from fatpipe.ops.reach.cluster import Cluster

pytestmark = pytest.mark.slow

# A short run: small enough for 2 cores, long enough to have a loss and sync-latency percentiles.
TRAIN = ["--preset", "tiny", "--steps", "6", "--batch-size", "4", "--seq-len", "64", "--max-restarts", "0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_project(folder: Path, name: str, nodes: int, isolation: str, octet: int) -> None:
    (folder / "fatpipe.toml").write_text(f"""\
[clusters.{name}]
provider = "sim"
nodes = {nodes}
tier = "1g"
isolation = "{isolation}"
private_cidr = "10.{octet}.0.0/24"
rdzv_port = {free_port()}
""")


def fatpipe(folder: Path, *args: str, timeout: float = 540) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "160", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("FATPIPE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def needs_terraform():
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform >= 1.4 on PATH")


def assert_nothing_left(folder: Path, name: str) -> None:
    state = folder / ".fatpipe" / name
    assert not (state / "outputs.json").exists()
    tfstate = json.loads((state / "terraform.tfstate").read_text())
    assert tfstate.get("resources", []) == []
    leftover = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"fp-{name}-" not in netns and f"fp-{name}" not in leftover
    for pid_file in (state / "runs").glob("*/**/node-*.pid"):
        pid = int(pid_file.read_text())
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1]


def up_report(folder: Path, name: str) -> dict:
    runs = folder / ".fatpipe" / name / "runs"
    run = runs / (runs / "latest").read_text().strip()
    return json.loads((run / "up.json").read_text())


def test_up_default_cluster_on_netns(needs_netns, project_dir):
    needs_terraform()
    write_project(project_dir, "upns", 4, "netns", 81)
    # --no-gate: a quick check on a busy 2-core machine may dip below the tier (netcheck's tests
    # cover the gate); training must run either way.
    steps = 10
    train = [*TRAIN[:2], "--steps", str(steps), *TRAIN[4:]]
    done = fatpipe(project_dir, "up", "--down-after", "--netcheck", "quick", "--no-gate", *train)
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-6000:]
    for shown in ("final loss", "sync latency p50 / p95", "busbw in netcheck", "time per phase", "up finished"):
        assert shown in done.stdout
    # Live on 4 nodes (the demo's mode) speaks once: one line a step for the cluster, the comm
    # decision once, no third-party logging (torchft's, c10d's), all of it on a screen or two.
    lines = done.stdout.splitlines()
    assert "fault tolerance: live" in done.stdout
    step_lines = [int(m[1]) for m in (re.search(r"\| step (\d+)/", line) for line in lines) if m]
    assert step_lines == list(range(1, steps + 1)), done.stdout
    assert done.stdout.count("comm=auto chose") <= 1
    for noise in ("torchft::", "[c10d]", "flight recorder", "lighthouse: serving", "relay: "):
        assert noise not in done.stdout, noise
    assert len(lines) <= 120, done.stdout
    up = up_report(project_dir, "upns")
    assert up["summary"]["final_loss"] > 0 and up["summary"]["sync_s_p50"] > 0
    assert up["summary"]["world_size"] == 4 and up["summary"]["netcheck_busbw_gbps"] > 0
    states = {p["name"]: p["state"] for p in up["phases"]}
    assert states.pop("data") == "skipped"  # no [data] declared
    assert list(states.values()) == ["done"] * 9  # wheels: done, with nothing to pay for on sim
    assert_nothing_left(project_dir, "upns")


def test_up_on_loopback_reruns_skip_what_is_done(project_dir):
    needs_terraform()
    write_project(project_dir, "uplb", 2, "loopback", 82)
    first = fatpipe(project_dir, "up", "--netcheck", "quick", *TRAIN)  # loopback: unshaped, far above 1g
    try:
        assert first.returncode == 0, first.stdout[-6000:]
        assert "final loss" in first.stdout and "sync latency" in first.stdout
        again = fatpipe(project_dir, "up", "--down-after", "--netcheck", "quick", *TRAIN)
        assert again.returncode == 0, again.stdout[-6000:]
        up = up_report(project_dir, "uplb")
        states = {p["name"]: p["state"] for p in up["phases"]}
        assert states == {"synth": "skipped", "wheels": "skipped", "deploy": "skipped", "wait": "skipped", "netcheck": "skipped",
                          "data": "skipped", "rendezvous": "done", "launch": "done", "summary": "done", "down": "done"}
        # The earlier netcheck was copied in, so the trainer's comm=auto read it for this run too.
        assert up["summary"]["netcheck_busbw_gbps"] > 0 and up["summary"]["final_loss"] > 0
    finally:
        fatpipe(project_dir, "down", timeout=120)
    assert_nothing_left(project_dir, "uplb")


def test_deployment_mismatch_and_netcheck_reuse(project_dir):
    from fatpipe.ops.reach.deployment import deployment_mismatch, reusable_netcheck

    write_project(project_dir, "uplb", 2, "loopback", 83)
    project = load_project()
    spec = project.cluster("uplb")
    outputs = parse_outputs({
        "name": "uplb", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.83.0.0/24",
        "rdzv_port": spec.rdzv_port, "isolation": "loopback",
        "nodes": [{"name": f"uplb-{i}", "private_ip": f"127.83.0.{10 + i}", "transport": "local"}
                  for i in range(2)],
    })
    assert deployment_mismatch(outputs, spec) is None
    assert "nodes is 2" in deployment_mismatch(outputs, spec.model_copy(update={"nodes": 3}))
    run_id, run_dir = new_run(project, "uplb")
    new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir)
    (run_dir / "netcheck.json").write_text(json.dumps({"gate": {"passed": False}}))
    assert reusable_netcheck(Cluster(project, spec), 0) is None
    (run_dir / "netcheck.json").write_text(json.dumps({"gate": {"passed": True}}))
    assert reusable_netcheck(Cluster(project, spec), 0) == run_dir / "netcheck.json"
    assert reusable_netcheck(Cluster(project, spec), (run_dir / "netcheck.json").stat().st_mtime + 1) is None
