"""What a user's script writes on the nodes comes back: `fatpipe pull` and `[run] pull` on a sim
cluster reached over SSH (network namespaces with an sshd each, a project folder of their own).

The script writes `out/ckpt.pt` (random bytes, different on each node) in the node's project
folder, outside the run folder, as nanoGPT writes its checkpoints to its own `out_dir`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import fatpipe_cli, require_ssh_sim, ssh_sim_toml

pytestmark = pytest.mark.slow

CLUSTER, OCTET, NODES = "t-pull", 241, 2
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-pull-")
JOB = """\
import os, pathlib, sys, time
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
(out / "ckpt.pt").write_bytes(os.environ["FATPIPE_NODE_NAME"].encode() + os.urandom(400_000))
(out / "step.txt").write_text("step 10\\n")
print("checkpoint written", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
sys.exit(3 if "fail" in sys.argv else 0)
"""


def fatpipe(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return fatpipe_cli(folder, *args, control_dir=CONTROL_DIR, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A deployed 2-node sim cluster over SSH and a project whose [run] pulls `out`."""
    require_ssh_sim()
    folder = tmp_path_factory.mktemp("pull")
    (folder / "fatpipe.toml").write_text(ssh_sim_toml(CLUSTER, NODES, OCTET, """\

[run]
pull = ["out"]
"""))
    # `out` is not git-ignored: being in [run] pull keeps it out of the project push.
    (folder / ".gitignore").write_text("got/\none/\nrefused/\n")
    (folder / "job.py").write_text(JOB)
    try:
        deployed = fatpipe(folder, "deploy", CLUSTER)
        assert deployed.returncode == 0, deployed.stdout
        yield folder
    finally:
        down = fatpipe(folder, "down", CLUSTER, timeout=300)
        assert down.returncode == 0, down.stdout


def on_node(folder: Path, index: int, rel: str) -> Path:
    """A path in the node's project folder (a sim node's folder lies on this machine)."""
    outputs = json.loads((folder / ".fatpipe" / CLUSTER / "outputs.json").read_text())
    return Path(outputs["nodes"][index]["remote_dir"]) / rel


def launch(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return fatpipe(folder, "launch", CLUSTER, "--max-restarts", "0", "--remote-python", sys.executable, *args)


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("Error")]


def test_run_pull_brings_node_0s_checkpoint_back_after_a_launch_and_fatpipe_pull_the_rest(cluster):
    folder = cluster
    done = launch(folder, "--", "job.py")
    assert done.returncode == 0, done.stdout[-5000:]
    ckpt = on_node(folder, 0, "out/ckpt.pt").read_bytes()
    assert ckpt.startswith(f"{CLUSTER}-0".encode()) and (folder / "out" / "ckpt.pt").read_bytes() == ckpt
    assert re.search(rf"pulled out \(\d+\.\d KiB\) from {CLUSTER}-0 into out \(new\)", done.stdout), done.stdout[-3000:]

    again = fatpipe(folder, "pull", CLUSTER, "out/ckpt.pt")  # the copy is there: refused, kept
    assert again.returncode == 1 and len(errors(again)) == 1 and "--force replaces it" in errors(again)[0], again.stdout
    assert (folder / "out" / "ckpt.pt").read_bytes() == ckpt

    every = fatpipe(folder, "pull", CLUSTER, "out", "--all", "--to", "got")
    assert every.returncode == 0, every.stdout
    for i in range(NODES):
        node = f"{CLUSTER}-{i}"
        pulled = folder / "got" / node / "out" / "ckpt.pt"
        assert pulled.read_bytes() == on_node(folder, i, "out/ckpt.pt").read_bytes(), node
        assert pulled.read_bytes().startswith(node.encode())
        assert f"from {node} into got/{node}/out (new)" in every.stdout, every.stdout
    one = fatpipe(folder, "pull", CLUSTER, "out/step.txt", "--node", f"{CLUSTER}-1", "--to", "one")
    assert one.returncode == 0 and (folder / "one" / "out" / "step.txt").read_text() == "step 10\n", one.stdout
    assert not list(folder.rglob(".pull-*"))

    # The next launch's project push (rsync --delete) neither ships the local copy nor deletes
    # what only the node holds.
    on_node(folder, 0, "out/node-only.txt").write_text("the node's")
    (folder / "out" / "local-only.txt").write_text("mine")
    done = launch(folder, "--", "job.py")
    assert done.returncode == 0, done.stdout[-5000:]
    assert on_node(folder, 0, "out/node-only.txt").read_text() == "the node's"
    assert not on_node(folder, 0, "out/local-only.txt").exists()


def test_a_bad_path_is_refused_in_one_line_and_nothing_lands(cluster):
    folder = cluster
    on_node(folder, 0, "leak").unlink(missing_ok=True)
    on_node(folder, 0, "leak").symlink_to("/etc")  # inside the folder, leading out of it
    for args, code, words in [
        (["/etc/passwd"], 2, "'/etc/passwd' must be relative to the project folder"),
        (["../../etc"], 2, "leaves the project folder"),
        (["nothing/here.pt"], 1, f"{CLUSTER}-0 (ssh "),
        (["nothing/here.pt"], 1, "cannot pull nothing/here.pt: realpath: "),
        (["leak/passwd"], 1, "leak/passwd resolves to /etc/passwd, outside the project folder"),
    ]:
        refused = fatpipe(folder, "pull", CLUSTER, *args, "--to", "refused")
        assert refused.returncode == code and len(errors(refused)) == 1, refused.stdout
        assert words in errors(refused)[0] and "Traceback" not in refused.stdout, refused.stdout
    assert not (folder / "refused").exists() or not any((folder / "refused").iterdir())


def test_force_replaces_the_local_copy_and_stop_pulls_run_pull_too(cluster):
    folder = cluster
    (folder / "out").mkdir(exist_ok=True)
    (folder / "out" / "ckpt.pt").write_bytes(b"an old local copy")
    for i in range(NODES):
        subprocess.run(["rm", "-rf", str(on_node(folder, i, "out"))], check=True)
    started = launch(folder, "--detach", "--", "job.py", "600")
    assert started.returncode == 0, started.stdout[-3000:]
    written = [on_node(folder, i, "out/step.txt") for i in range(NODES)]  # after ckpt.pt, before the sleep
    deadline = time.monotonic() + 300
    while not all(path.exists() for path in written) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(path.exists() for path in written), fatpipe(folder, "logs", CLUSTER).stdout[-3000:]
    forced = fatpipe(folder, "pull", CLUSTER, "out/ckpt.pt", "--force")
    assert forced.returncode == 0 and "(replacing the earlier copy)" in forced.stdout, forced.stdout
    assert (folder / "out" / "ckpt.pt").read_bytes() == on_node(folder, 0, "out/ckpt.pt").read_bytes()

    (folder / "out" / "ckpt.pt").write_bytes(b"changed here")
    stopped = fatpipe(folder, "stop", CLUSTER)
    assert stopped.returncode == 0 and "(replacing the earlier copy)" in stopped.stdout, stopped.stdout
    assert (folder / "out" / "ckpt.pt").read_bytes() == on_node(folder, 0, "out/ckpt.pt").read_bytes()


def test_up_pulls_run_pull_after_a_failed_run_too(cluster):
    folder = cluster
    subprocess.run(["rm", "-rf", str(folder / "out")], check=True)
    up = fatpipe(folder, "up", CLUSTER, "--netcheck", "off", "--max-restarts", "0", "--remote-python",
                 sys.executable, "--", "job.py", "0", "fail", timeout=900)
    assert up.returncode != 0 and "up failed" in up.stdout, up.stdout[-5000:]
    assert re.search(rf"pulled out \(\d+\.\d KiB\) from {CLUSTER}-0 into out \(new\)", up.stdout), up.stdout[-3000:]
    assert (folder / "out" / "ckpt.pt").read_bytes() == on_node(folder, 0, "out/ckpt.pt").read_bytes()
