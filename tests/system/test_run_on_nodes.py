"""A run on the nodes survives fatpipe: detached, stopped, started again, it goes on from its last
checkpoint and ends where an uninterrupted run ends.

The nodes are two sim nodes reached over SSH (`transport = "ssh"`: network namespaces with an
sshd each, their files below their own folders), deployed once with the real CLI and terraform,
on a slow link so that a run lasts long enough to be stopped halfway. An uninterrupted run on
them is the reference. Then: `launch --detach`, a Ctrl-C in `logs -f` and `stop` once the first
checkpoints exist (each brings the logs and metrics back, the checkpoints stay on the nodes),
`launch --run ID` (its push must not touch what the nodes wrote), and `runs pull --checkpoints`:
the final checkpoint's tensors equal the uninterrupted run's (same seed, same steps).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import faults
import pytest

from fatpipe.trainer.metrics import read_metrics

from .conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

NAME, OCTET = "t-keep", 158
STEPS, EVERY = 40, 4
LINK_GBPS = 0.05  # a step syncs 3.3 MB: about half a second on this link
TRAIN = ["--preset", "tiny", "--steps", str(STEPS), "--batch-size", "4", "--seq-len", "64",
         "--warmup-steps", "3", "--checkpoint-every", str(EVERY), "--comm", "none"]
RUN_TIMEOUT_S = 600
# ssh's multiplexing sockets need a short path (108 bytes): not below pytest's tmp folder.
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-keep-")


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = faults.cli_env(FATPIPE_SSH_CONTROL_DIR=CONTROL_DIR)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture
def nodes_over_ssh(needs_netns, needs_ssh, tmp_path):
    """Two sim nodes with sshd, deployed; destroyed afterwards whatever happened."""
    if not shutil.which("terraform"):
        pytest.skip("needs terraform on PATH")
    (tmp_path / "fatpipe.toml").write_text(f"""\
[clusters.{NAME}]
provider = "sim"
nodes = 2
tier = "1g"
link_gbps = {LINK_GBPS}
isolation = "netns"
transport = "ssh"
private_cidr = "10.{OCTET}.0.0/24"
rdzv_port = {free_port()}
""")
    try:
        deployed = fatpipe(tmp_path, "deploy", NAME, "--yes")
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        yield tmp_path
    finally:
        down = fatpipe(tmp_path, "down", NAME, timeout=300)
        assert down.returncode == 0, down.stdout[-4000:]


def checkpoint_steps(folder: Path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in folder.glob("step-*.pt"))


def final_model(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_a_stopped_run_goes_on_from_its_checkpoint_on_the_nodes(nodes_over_ssh):
    folder = nodes_over_ssh
    runs = folder / ".fatpipe" / NAME / "runs"
    whole = fatpipe(folder, "launch", NAME, "--remote-python", sys.executable, "--timeout", str(RUN_TIMEOUT_S), *TRAIN)
    assert whole.returncode == 0, whole.stdout[-4000:]
    reference = runs / (runs / "latest").read_text().strip()
    expected = json.loads((reference / "summary.json").read_text())
    assert not (reference / "checkpoints").exists()  # they stay on the nodes
    pulled = fatpipe(folder, "runs", "pull", NAME, "latest", "--checkpoints")
    assert pulled.returncode == 0, pulled.stdout

    started = fatpipe(folder, "launch", NAME, "--detach", "--remote-python", sys.executable, *TRAIN)
    assert started.returncode == 0, started.stdout[-4000:]
    run_id = (runs / "latest").read_text().strip()
    run_dir = runs / run_id
    outputs = json.loads((folder / ".fatpipe" / NAME / "outputs.json").read_text())
    on_node = [Path(n["remote_dir"]) / ".fatpipe" / NAME / "runs" / run_id for n in outputs["nodes"]]
    faults.wait_for("the first checkpoint on node 0", lambda: checkpoint_steps(on_node[0] / "checkpoints"),
                    RUN_TIMEOUT_S)

    # A Ctrl-C in `logs -f` detaches and brings back what exists so far; the run goes on.
    following = folder / "follow.out"
    with open(following, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fatpipe.cli", "logs", NAME, "-f"], cwd=folder,
                                env=faults.cli_env(FATPIPE_SSH_CONTROL_DIR=CONTROL_DIR), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        faults.wait_for("a step in `logs -f`", lambda: re.search(r"\bstep \d+/", following.read_text()), 120)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    assert "detached; run" in following.read_text() and (run_dir / "metrics.jsonl").is_file(), \
        following.read_text()[-3000:]

    stopped = fatpipe(folder, "stop", NAME)
    assert stopped.returncode == 0, stopped.stdout[-4000:]
    kept = checkpoint_steps(on_node[0] / "checkpoints")
    assert kept and kept[-1] < STEPS, f"the run ended before it was stopped: {kept}"
    # stop brought back what exists; the checkpoints stayed on the nodes.
    assert (run_dir / "node-0.log").is_file() and (run_dir / "node-1.log").is_file(), stopped.stdout
    assert (run_dir / "metrics.jsonl").is_file() and not (run_dir / "checkpoints").exists()
    assert (on_node[1] / "checkpoints" / "rank-1").is_dir()

    resumed = fatpipe(folder, "launch", NAME, "--run", run_id, "--timeout", str(RUN_TIMEOUT_S))
    assert resumed.returncode == 0, resumed.stdout[-6000:]
    starts = [int(s) for s in re.findall(r"start at step (\d+)", resumed.stdout)]
    printed = [int(s) for s in re.findall(rf"\bstep (\d+)/{STEPS} loss ", resumed.stdout)]
    assert starts == [kept[-1]], resumed.stdout[-6000:]
    assert printed and printed[0] > kept[-1], printed
    # The whole run's record: the stopped attempt's lines kept (past the checkpoint too), the
    # resumed steps after them, the first one back marked, and every step once as read; the first
    # attempt's log kept beside the second's.
    written = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = len(written) - (STEPS - kept[-1])  # the stopped attempt's last step
    assert [r["step"] for r in written] == [*range(1, first + 1), *range(kept[-1] + 1, STEPS + 1)]
    assert first == kept[-1] or written[first]["rewound_from"] == first
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert "start at step 0" in (run_dir / "node-0.earlier.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["param_digests"] == expected["param_digests"], \
        "the resumed run's parameters differ from an uninterrupted run's"

    pulled = fatpipe(folder, "runs", "pull", NAME, run_id, "--checkpoints")
    assert pulled.returncode == 0, pulled.stdout
    assert re.search(r"run \S+: [0-9.]+ (KiB|MiB|GiB) of checkpoints to pull", pulled.stdout), pulled.stdout
    local = run_dir / "checkpoints"
    assert checkpoint_steps(local)[-1] == STEPS
    assert checkpoint_steps(local / "rank-0")[-1] == STEPS and checkpoint_steps(local / "rank-1")[-1] == STEPS
    got, want = final_model(local / f"step-{STEPS:08d}.pt"), final_model(reference / "checkpoints" /
                                                                          f"step-{STEPS:08d}.pt")
    assert got.keys() == want.keys()
    differ = [key for key in want if not bool((got[key] == want[key]).all())]
    assert not differ, f"parameters differ from an uninterrupted run's: {differ}"
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".pull-")]
    assert os.listdir(on_node[0] / "checkpoints")  # a pull copies, the node keeps its own
