"""A failed or detached run on ssh nodes says what actually happened: a 2-node sim cluster whose
nodes run an sshd each (`transport = "ssh"`), deployed once with the real CLI and terraform.

The failure line names the first error of any worker (rank, node, type, message) from torchrun's
per-rank error files, and treats the connection errors that follow as consequences: a script that
raises on rank 1 only, one that raises on every rank, one that exits non-zero without an
exception, the built-in trainer given a git-ignored data file. `fatpipe logs` of an ended run,
followed or not (a detached one too), closes with the same line and a non-zero status. A file the nodes lack because it
was not copied (git-ignored, outside the project) gets why and how to send it. A detached run's
last step and loss are visible in `status --json` and `runs --json` while it runs.
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

NAME, OCTET = "rc28", 187
RUN = ["--max-restarts", "0", "--remote-python", sys.executable, "--timeout", "240"]
CONTROL_DIR = tempfile.mkdtemp(prefix="fp-cm-rc-")  # ssh's sockets need a short path

JOB = """\
import datetime, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, mode = dist.get_rank(), sys.argv[1]
if mode == "rank1" and rank == 1:
    time.sleep(1)  # rank 0 waits in the all-reduce below: it sees the connection go
    raise ValueError("DistributedDataParallel device_ids must be None for CPU modules")
if mode == "every":
    raise ValueError(f"bad setting on rank {rank}")
if mode == "exit" and rank == 1:
    time.sleep(1)
    sys.exit(3)
if mode == "open":
    open(sys.argv[2], "rb")
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
"""


def fatpipe(folder: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "FATPIPE_SSH_CONTROL_DIR": CONTROL_DIR,
           "FATPIPE_REMOTE_DIR": str(folder.parent / "remote" / "{node}")}
    env.pop("FATPIPE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture(scope="module")
def project(tmp_path_factory, needs_netns_module, needs_ssh_module):
    folder = tmp_path_factory.mktemp("rootcause") / "project"
    folder.mkdir()
    (folder / "fatpipe.toml").write_text(
        f'[clusters.{NAME}]\nprovider = "sim"\nnodes = 2\ntier = "1g"\nisolation = "netns"\n'
        f'transport = "ssh"\nprivate_cidr = "10.{OCTET}.0.0/24"\nrdzv_port = {29500 + OCTET}\n')
    (folder / "job.py").write_text(JOB)
    (folder / ".gitignore").write_text("data/\n")
    (folder / "data").mkdir()
    (folder / "data" / "train.txt").write_text("git-ignored, so never copied to the nodes\n" * 50)
    (folder.parent / "shared.bin").write_bytes(b"outside the project folder")
    try:
        done = fatpipe(folder, "deploy", NAME, "--yes", timeout=600)
        assert done.returncode == 0, done.stdout[-4000:]
        yield folder
    finally:
        fatpipe(folder, "down", NAME, timeout=300)
        from fatpipe.stacks.sim import net as simnet

        simnet.sweep_cluster(NAME, folder / ".fatpipe" / NAME / "nodes")


@pytest.fixture(scope="module")
def needs_netns_module():
    from conftest import netns_available, skip_or_fail

    if not netns_available():
        skip_or_fail("needs root and `ip netns`")


@pytest.fixture(scope="module")
def needs_ssh_module():
    import shutil

    from conftest import skip_or_fail

    from .conftest import SSHD

    if not (Path(SSHD).exists() and shutil.which("ssh") and shutil.which("rsync")):
        skip_or_fail("needs the Debian packages openssh-server openssh-client rsync (make system-packages)")


def error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0, done.stdout[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, done.stdout[-4000:]
    print(lines[0])
    return lines[0]


def test_the_rank_that_raised_is_named_not_the_connection_errors_after_it(project):
    line = error_line(fatpipe(project, "launch", NAME, *RUN, "--", "job.py", "rank1"))
    assert line.startswith(f"error: rank 1 on {NAME}-1 failed first: ValueError: DistributedDataParallel "
                           "device_ids must be None for CPU modules"), line
    assert f"the connection errors on {NAME}-0 followed from it" in line, line
    # `fatpipe logs` of the ended run, followed or not, closes with the same line and status.
    for follow in ((), ("-f",)):
        logs = fatpipe(project, "logs", NAME, *follow)
        assert logs.returncode == 1, logs.stdout[-4000:]
        assert [out for out in logs.stdout.splitlines() if out.startswith("error: ")] == [line], logs.stdout[-4000:]


def test_logs_of_a_detached_run_that_failed_name_the_cause_and_exit_non_zero(project):
    started = fatpipe(project, "launch", NAME, *RUN, "--detach", "--", "job.py", "rank1")
    assert started.returncode == 0, started.stdout[-4000:]
    # While it runs, `logs` prints what there is and exits 0; once over, it pulls the run's
    # error files from the nodes and ends with the failure line a followed launch prints.
    deadline, logs = time.monotonic() + 240, None
    while time.monotonic() < deadline:
        logs = fatpipe(project, "logs", NAME, timeout=120)
        if logs.returncode != 0 or "error: " in logs.stdout:
            break
        time.sleep(2)
    line = error_line(logs)
    assert logs.returncode == 1, logs.stdout[-4000:]
    assert line.startswith(f"error: rank 1 on {NAME}-1 failed first: ValueError: DistributedDataParallel "
                           "device_ids must be None for CPU modules"), line
    followed = fatpipe(project, "logs", NAME, "-f")
    assert followed.returncode == 1 and error_line(followed) == line, followed.stdout[-4000:]


def test_every_rank_raising_names_the_first_one(project):
    line = error_line(fatpipe(project, "launch", NAME, *RUN, "--", "job.py", "every"))
    m = re.match(rf"error: rank (\d) on {NAME}-(\d) failed first: ValueError: bad setting on rank (\d)", line)
    assert m and m[1] == m[2] == m[3], line


def test_an_exit_without_an_exception_is_named_with_its_status(project):
    line = error_line(fatpipe(project, "launch", NAME, *RUN, "--", "job.py", "exit"))
    assert line.startswith(f"error: rank 1 on {NAME}-1 failed first: exit status 3, without a Python "
                           "exception"), line


def test_a_git_ignored_file_is_named_with_why_and_how_to_send_it(project):
    # The built-in trainer: its data file exists here, but .gitignore kept it off the nodes.
    done = fatpipe(project, "launch", NAME, *RUN, "--preset", "tiny", "--steps", "2", "--batch-size", "2",
                   "--seq-len", "32", "--comm", "none", "--data", "data/train.txt")
    line = error_line(done)
    assert re.match(rf"error: rank (\d) on {NAME}-\1 failed first: ConfigError: --data data/train.txt: "
                    "no such file or folder", line), line
    assert ("data/train.txt exists here but was not copied to the nodes: it is git-ignored, and the "
            "project copy honours .gitignore; send it with a [data] section in fatpipe.toml") in line, line


def test_a_file_outside_the_project_is_named_with_why(project):
    line = error_line(fatpipe(project, "launch", NAME, *RUN, "--", "job.py", "open", "../shared.bin"))
    assert "FileNotFoundError: [Errno 2] No such file or directory: '../shared.bin'" in line, line
    assert (f"{project.parent / 'shared.bin'} exists on this machine but lies outside the project "
            "folder, which is all fatpipe copies to the nodes; send it with a [data] section") in line, line


def test_a_detached_run_shows_its_progress_while_it_runs(project):
    started = fatpipe(project, "launch", NAME, *RUN, "--detach", "--preset", "tiny", "--steps", "100000",
                      "--batch-size", "2", "--seq-len", "32", "--comm", "none", "--warmup-steps", "1")
    assert started.returncode == 0, started.stdout[-4000:]
    try:
        deadline, run = time.monotonic() + 240, None
        while time.monotonic() < deadline:
            status = fatpipe(project, "status", NAME, "--json", timeout=120)
            assert status.returncode == 0, status.stdout[-4000:]
            run = json.loads(status.stdout)["run"]
            if run["last_step"] is not None and run["last_step"] >= 3:
                break
            time.sleep(2)
        assert run and run["outcome"] == "running" and run["last_step"] >= 3, run
        assert isinstance(run["final_loss"], float) and run["final_loss"] > 0, run
        listed = fatpipe(project, "runs", NAME, "--json", timeout=120)
        latest = next(r for r in json.loads(listed.stdout) if r["latest"])
        assert latest["outcome"] == "running" and latest["steps"] >= run["last_step"], latest
    finally:
        stopped = fatpipe(project, "stop", NAME, timeout=300)
        assert stopped.returncode == 0, stopped.stdout[-4000:]


SCRIPT = """\
import os, sys
print(__name__, sys.argv, sys.path[0] == os.path.dirname(os.path.abspath(__file__)), flush=True)
if sys.argv[1] == "raise":
    open(os.path.join("missing", "train.bin"))
sys.exit(int(sys.argv[1]))
"""


def test_a_user_script_keeps_its_main_semantics_and_its_error_lands_in_the_error_file(tmp_path):
    from fatpipe.ops.run.rootcause import read_error_file

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "job.py").write_text(SCRIPT)
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": "error.json", "RANK": "3", "FATPIPE_NODE_NAME": "n-1"}

    def run(arg: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fatpipe.trainer.api.userscript", "sub/job.py", arg],
                              cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)

    done = run("raise")
    assert done.returncode == 1 and "FileNotFoundError" in done.stderr, done.stderr
    assert done.stdout.startswith("__main__ ['sub/job.py', 'raise'] True"), done.stdout
    error = read_error_file(tmp_path / "error.json", "?")
    assert (error.rank, error.node, error.type, error.filename) == (3, "n-1", "FileNotFoundError", "missing/train.bin")
    (tmp_path / "error.json").unlink()
    done = run("3")  # an exit status is no exception: torchrun's own report names it
    assert done.returncode == 3 and not (tmp_path / "error.json").exists(), done.stderr
    assert run("0").returncode == 0
