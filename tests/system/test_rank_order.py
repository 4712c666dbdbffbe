"""Rank 0's duties follow the node torch made rank 0, on an `ssh` cluster whose private addresses
sort otherwise as strings than as numbers (docs/ARCHITECTURE.md, "Rendezvous").

Three sim machines with an sshd each (reached on 10.214.0.10-12) carry a second address chosen
here: 10.214.0.9, 10.214.0.100 and 10.214.0.25. The `ssh` cluster declares those as the nodes'
private IPs, in that order. torch's c10d rendezvous sorts the nodes by that address as a string, so
node 1 (.100) becomes group rank 0, node 2 (.25) rank 1 and node 0 (.9) rank 2. Yet the data
chain starts at node 0, which holds the uplink's copy; `status` and `runs` read the detached run's
steps from node 1, where rank 0 wrote them; `fatpipe pull` and `[run] pull` bring a script's
outputs from there; and what fatpipe names as the run's leader is the node whose workers torch
gave rank 0.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fatpipe.infra.defaults import GROUP_RANK_FILE

from .conftest import fatpipe_cli, free_port, require_ssh_sim

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

HOSTS, RENTED, OCTET, NODES = "rk-hosts", "rk-rented", 214, 3
PRIVATE = ["10.214.0.9", "10.214.0.100", "10.214.0.25"]
TORCH_RANKS = [2, 0, 1]  # sorted as strings: .100 < .25 < .9
STEPS = 4  # as JOB runs
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-rk-")
CHUNK = 1 << 20
DATA = {"train.bin": 2 * CHUNK + 777, "meta.txt": 33}
# Every rank says which node it is on and which group rank torch gave it; rank 0 writes the
# script's output (pulled by `[run] pull` and `fatpipe pull`) and records its steps.
JOB = """\
import json, os, pathlib, torch, torch.distributed as dist
import fatpipe.trainer.api as fatpipe
dist.init_process_group("gloo")
node, group = os.environ["FATPIPE_NODE_NAME"], int(os.environ["GROUP_RANK"])
print(f"WHOAMI rank={dist.get_rank()} group_rank={group} node={node}", flush=True)
torch.manual_seed(0)
model = fatpipe.wrap(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    loss = model(torch.randn(4, 16)).square().mean()
    loss.backward()
    opt.step()
    fatpipe.step(loss, tokens=4)
    opt.zero_grad()
if dist.get_rank() == 0:
    pathlib.Path("out").mkdir(exist_ok=True)
    pathlib.Path("out/result.json").write_text(json.dumps({"node": node, "group_rank": group}))
fatpipe.finish()
dist.destroy_process_group()
"""


def write_project(folder: Path) -> None:
    hosts = "\n".join(
        f'[[clusters.{RENTED}.hosts]]\naddress = "10.{OCTET}.0.{10 + i}"\nprivate_ip = "{PRIVATE[i]}"\n'
        f'remote_dir = "{folder}/fatpipe/{i}"\n' for i in range(NODES))
    (folder / "fatpipe.toml").write_text(f"""\
[clusters.{HOSTS}]
provider = "sim"
nodes = {NODES}
tier = "1g"
isolation = "netns"
transport = "ssh"
private_cidr = "10.{OCTET}.0.0/24"

[clusters.{RENTED}]
provider = "ssh"
tier = "1g"
ssh_user = "root"
ssh_key_file = "{folder}/.fatpipe/{HOSTS}/ssh/id_ed25519"
install_packages = false    # these share this machine's packages
private_cidr = "10.{OCTET}.0.0/24"
rdzv_port = {free_port()}

{hosts}
[data]
source = "data/set"
chunk_mib = 1

[run]
pull = ["out"]
""")
    # The nodes share this machine's files: their folders and the data never travel with the project.
    (folder / ".gitignore").write_text("/fatpipe/\ndata/\nout/\nfetched/\n")
    (folder / "job.py").write_text(JOB)
    for name, size in DATA.items():
        path = folder / "data" / "set" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The three machines, each with its chosen second address, declared as the `ssh` cluster."""
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("rank")
    write_project(folder)
    deployed = fatpipe(folder, "deploy", HOSTS)
    assert deployed.returncode == 0, deployed.stdout[-4000:]
    try:
        for i, ip in enumerate(PRIVATE):
            subprocess.run(["ip", "-n", f"fp-{HOSTS}-{i}", "addr", "add", f"{ip}/24", "dev", "eth0"],
                           check=True, capture_output=True, timeout=30)
        deployed = fatpipe(folder, "deploy", RENTED)
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        yield folder
    finally:
        fatpipe(folder, "down", RENTED, timeout=300)
        down = fatpipe(folder, "down", HOSTS, timeout=300)
        assert down.returncode == 0, down.stdout


def node_folder(folder: Path, index: int) -> Path:
    return folder / "fatpipe" / str(index)


def node_logs(folder: Path, rel: Path) -> str:
    """Each node's own log of the run, for a failure's message (`down` removes them afterwards)."""
    logs = [(node_folder(folder, i) / rel / f"node-{i}.log") for i in range(NODES)]
    return "\n".join(f"--- node {i}\n" + (log.read_text()[-3000:] if log.exists() else "(no log)")
                     for i, log in enumerate(logs))


def test_rank_0s_duties_follow_the_node_torch_made_rank_0(cluster):
    folder, py = cluster, sys.executable
    # The run's plan, as fatpipe shows it: torch's order, not the nodes'.
    shown = fatpipe(folder, "rendezvous", RENTED, "--max-restarts", "0", "--remote-python", py, "--", "job.py")
    assert shown.returncode == 0, shown.stdout
    for i, rank in enumerate(TORCH_RANKS):
        assert f"node {i:<3} group rank {rank:<3} {RENTED}-{i}" in shown.stdout, shown.stdout
    run_id = re.search(r"^run (\S+):", shown.stdout, re.M).group(1)

    # The data chain: this machine heads it, then node 0 and on in node order, whatever rank each has.
    pushed = fatpipe(folder, "data", "push", RENTED, "--remote-python", py, timeout=420)
    assert pushed.returncode == 0, pushed.stdout[-4000:]
    for i in range(NODES):
        for name in DATA:
            assert (node_folder(folder, i) / "data/set" / name).read_bytes() == \
                (folder / "data/set" / name).read_bytes(), (i, name)

    # A detached run: nothing comes back here until it is pulled; status and runs ask the leader.
    launched = fatpipe(folder, "launch", RENTED, "--run", run_id, "--detach", timeout=300)
    assert launched.returncode == 0, launched.stdout[-4000:]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = json.loads(fatpipe(folder, "status", RENTED, "--json").stdout)
        if all(s.lstrip("-").isdigit() for s in status["run"]["nodes"].values()):
            break
        time.sleep(3)
    run = status["run"]
    assert run["id"] == run_id and run["nodes"] == {f"{RENTED}-{i}": "0" for i in range(NODES)}, \
        (status, node_logs(folder, Path(run["dir"]).relative_to(folder)))
    run_dir = Path(run["dir"])
    assert not (run_dir / "metrics.jsonl").exists()  # status read it on the leader, over ssh
    assert run["last_step"] == STEPS and run["summary"]["steps"] == STEPS, status
    listed = json.loads(fatpipe(folder, "runs", RENTED, "--json").stdout)
    assert [r["steps"] for r in listed if r["latest"]] == [STEPS], listed

    # What torch did, in the nodes' own words: rank 0 on node 1, and each node's record says so.
    leader, rel = f"{RENTED}-1", run_dir.relative_to(folder)
    for i, rank in enumerate(TORCH_RANKS):
        there = node_folder(folder, i) / rel
        assert f"WHOAMI rank={rank} group_rank={rank} node={RENTED}-{i}" in (there / f"node-{i}.log").read_text()
        assert (there / GROUP_RANK_FILE.format(index=i)).read_text().strip() == str(rank)

    # A script's output comes from the leader: `fatpipe pull` by default, `[run] pull` on stop.
    fetched = fatpipe(folder, "pull", RENTED, "out", "--to", "fetched")
    assert fetched.returncode == 0, fetched.stdout
    assert json.loads((folder / "fetched/out/result.json").read_text()) == {"node": leader, "group_rank": 0}
    stopped = fatpipe(folder, "stop", RENTED)
    assert stopped.returncode == 0 and "warning" not in stopped.stdout, stopped.stdout
    assert json.loads((folder / "out/result.json").read_text()) == {"node": leader, "group_rank": 0}
    # The pulled run folder holds each node's record, and rank 0's metrics from node 1.
    for i, rank in enumerate(TORCH_RANKS):
        assert (run_dir / GROUP_RANK_FILE.format(index=i)).read_text().strip() == str(rank)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
