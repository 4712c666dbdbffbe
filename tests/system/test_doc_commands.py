"""Every `fatpipe` command of the README's tour and of the guides' examples, run as written on one sim cluster.

The doc blocks' commands (tests/doccommands.py) run in a project holding what they name (a text
to tokenize, a `[data]` section, a `train.py`, a file a script wrote), with the clusters they
name (`demo`, `lab`) and their nodes read as this test's cluster, and `--steps` capped. They run
in doc order within four groups, so one deployment serves them all: the commands that need no
cluster, then those that bring it up, then those that use it, then those that destroy it. A
command that reads the same after that rewriting runs once. `fatpipe init` writes a new
fatpipe.toml, so it runs in a folder of its own. Blocks marked `<!-- not run: ... -->` (a cloud
account, a VM, machines of your own) are only parsed (tests/unit/test_doc_commands.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import faults
import pytest
from conftest import skip_or_fail
from doccommands import REPO, DocCommand, doc_commands

from .test_up import write_project as write_cluster

pytestmark = pytest.mark.slow

CLUSTER = "t-gd-doc"
NAMES = ("demo", "lab")  # the clusters the docs' runnable blocks name
MAX_STEPS = 4
NEEDS_NO_CLUSTER = {"config", "plan", "catalog", "synth", "init"}
BRINGS_UP = {"up", "deploy", "wait"}
DESTROYS = {"down"}


def rewrite(args: tuple[str, ...]) -> tuple[str, ...]:
    """The docs' cluster and node names as this test's, and every `--steps N` capped."""
    out: list[str] = []
    for i, arg in enumerate(args):
        node = re.fullmatch(rf"({'|'.join(NAMES)})-(\d+)", arg)
        if arg in NAMES:
            arg = CLUSTER
        elif node:
            arg = f"{CLUSTER}-{node[2]}"
        elif i and args[i - 1] == "--steps" and arg.isdigit():
            arg = str(min(int(arg), MAX_STEPS))
        out.append(arg)
    return tuple(out)


def group(command: tuple[str, ...]) -> int:
    verb = command[0]
    if verb == "data" and command[1:2] == ("prepare",) or verb in NEEDS_NO_CLUSTER:
        return 0
    if verb in DESTROYS or "--down-after" in command:
        return 3
    return 1 if verb in BRINGS_UP else 2


def runnable(commands: list[DocCommand]) -> list[tuple[DocCommand, tuple[str, ...]]]:
    """The commands to run, each once, in the order that lets one deployment serve them."""
    seen: set[tuple] = set()
    order = []
    for command in commands:
        if command.program != "fatpipe" or command.not_run is not None:
            continue
        args = command.args if command.args[:1] == ("init",) else rewrite(command.args)
        key = (args, tuple(sorted(command.env.items())))
        if key not in seen:
            seen.add(key)
            order.append((command, args))
    return sorted(order, key=lambda pair: group(pair[1]))  # stable: doc order within a group


def write_project(folder: Path) -> None:
    """What the commands name: the cluster, a text to tokenize and the `[data]` it becomes,
    `train.py` and the example script, and a file a script wrote on the nodes (`out/ckpt.pt`)."""
    write_cluster(folder, CLUSTER, 2, "loopback", 226)
    with open(folder / "fatpipe.toml", "a") as toml:
        toml.write('\n[data]\nsource = "data/tok"\n\n'
                   '[train]\ndata = "data/tok"\nbatch_size = 4\nseq_len = 64\neval_windows = 8\n')
    text = "".join(p.read_text() for p in sorted((REPO / "trainer").glob("*.py")))
    (folder / "input.txt").write_text(text)
    (folder / "examples").mkdir()
    shutil.copy(REPO / "examples" / "ddp_script.py", folder / "examples" / "ddp_script.py")
    script = (REPO / "examples" / "ddp_script.py").read_text()  # train.py: the example, 4 steps
    few = script.replace('"--steps", type=int, default=50', f'"--steps", type=int, default={MAX_STEPS}')
    assert few != script
    (folder / "train.py").write_text(few)
    (folder / "out").mkdir()
    (folder / "out" / "ckpt.pt").write_bytes(b"what a script wrote")


def run(folder: Path, command: DocCommand, args: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder,
                          env=faults.cli_env(**command.env), text=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=420)


def test_every_runnable_doc_command_runs_on_the_sim(project_dir):
    if not shutil.which("terraform"):
        skip_or_fail("needs terraform >= 1.4 on PATH")
    commands = runnable(doc_commands())
    assert len(commands) >= 20
    write_project(project_dir)
    fresh = project_dir / "fresh"  # `fatpipe init` writes the file it starts from
    fresh.mkdir()
    failed = []
    try:
        for command, args in commands:
            folder = fresh if args[0] == "init" else project_dir
            started = time.monotonic()
            done = run(folder, command, args)
            print(f"$ fatpipe {' '.join(args)}   ({command.source}) -> exit {done.returncode} "
                  f"in {time.monotonic() - started:.0f} s\n"
                  f"{done.stdout[-3000:]}")
            if done.returncode != 0:
                failed.append(f"{command} -> exit {done.returncode}: {done.stdout[-1500:]}")
    finally:
        run(project_dir, DocCommand("teardown", "fatpipe", ()), ("down", CLUSTER))
    assert failed == []
    assert not (project_dir / ".fatpipe" / CLUSTER / "outputs.json").exists()
    assert (project_dir / "data" / "tok").is_dir() and (fresh / "fatpipe.toml").exists()
    assert (project_dir / "got" / f"{CLUSTER}-1" / "out" / "ckpt.pt").read_bytes() == b"what a script wrote"
