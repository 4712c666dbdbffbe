"""The node programs of the data side and the quick link check, sent with the command: one
round trip, nothing installed first.

A node runs `python3 -c <node/databoot.py>` and reads the rest on its standard input in one JSON
line: the standard-library modules of `fatpipe.trainer` the program needs (the staging check and
chain: STAGING; the quick link check: NETCHECK), as this machine has them, so a node runs the
operator's version; the files to write first (the manifest), the environment and the entry point.
No venv, no torch, no trainer package on the node: a fresh node checks and receives data, and
measures its links, before its environment exists.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from fatpipe.node import source_file
from fatpipe.trainer import bandwidth as _bandwidth

from ..reach.projectdir import NODE_CHECKS_FILE as NODE_CHECKS

BOOT = source_file("databoot")
CLAIMED = "fatpipe-claimed: "  # as node/databoot.py says it
TRAINER = Path(_bandwidth.__file__).parent
# The standard-library modules of the trainer each program needs, by their path under trainer/.
STAGING = ("staging/names", "staging/hashcache", "staging/manifest", "staging/tidy", "staging/record",
           "staging/check", "staging/chainfiles", "staging/chainlink", "staging/stage")
NETCHECK = ("bandwidth", "net/iperf3", "net/p2psocket", "net/p2p", "net/ring", "net/quick")


def modules(sent_paths: tuple[str, ...] = STAGING) -> dict[str, tuple[bool, str]]:
    """name -> (is a package, source): the packages as empty shells (fatpipe.trainer's own
    __init__ may want torch) but for their docstrings, the modules as they are here."""
    sent = {"fatpipe": (True, ""), "fatpipe.trainer": (True, "")}
    for rel in sent_paths:
        *folders, name = rel.split("/")
        for depth in range(1, len(folders) + 1):
            package = "fatpipe.trainer." + ".".join(folders[:depth])
            sent.setdefault(package, (True, (TRAINER.joinpath(*folders[:depth]) / "__init__.py").read_text()))
        sent["fatpipe.trainer." + ".".join([*folders, name])] = (False, (TRAINER / f"{rel}.py").read_text())
    return sent


def boot_command(python: str) -> str:
    """The shell text that starts the program in the current folder (fixed text and a quoted python)."""
    return f"exec {shlex.quote(python)} -c {shlex.quote(BOOT.read_text())}"


def program_line(main: str, argv: list[str], files: dict[str, str] | None = None, env: dict[str, str] | None = None,
                 watch: bool = False, claim: tuple[str, str, str] | None = None,
                 sent_paths: tuple[str, ...] = STAGING) -> str:
    """The one line on the program's standard input: what it imports (`sent_paths`), writes and
    runs; with `claim` (folder, cluster, project id) the program first claims the folder and runs in it."""
    sent = modules(sent_paths)
    if claim:
        sent["callsteps"] = (False, NODE_CHECKS.read_text())
    return json.dumps({"modules": sent, "files": files or {}, "env": env or {}, "main": main,
                       "argv": argv, "watch": watch, "claim": list(claim) if claim else None}) + "\n"


def claimed(stdout: str) -> tuple[tuple[str, str] | None, list[str]]:
    """The claim's (answer, rest) from a claiming program's output (None: it never said), and the
    program's own lines after it."""
    lines = stdout.strip().splitlines()
    said = next((json.loads(line[len(CLAIMED):]) for line in lines if line.startswith(CLAIMED)), None)
    return (tuple(said) if said else None), [line for line in lines if not line.startswith(CLAIMED)]
