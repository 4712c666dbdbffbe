"""The data side's node program, sent with the command: one round trip, nothing installed first.

A node runs `python3 -c <nodeboot>` in its project folder and reads the rest on its standard
input in one JSON line: the standard-library modules of `fatpipe.trainer.staging` that the check
and the chain need (as this machine has them, so a node runs the operator's version), the files to
write first (the manifest), the environment and the entry point. No venv, no torch, no trainer
package on the node: a fresh node checks and receives data before its environment exists.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from fatpipe.trainer.staging import manifest as _manifest

BOOT = Path(__file__).with_name("nodeboot.py")
STAGING = Path(_manifest.__file__).parent
SENT_MODULES = ("names", "hashcache", "manifest", "tidy", "check", "chainfiles", "chainlink", "stage")


def modules() -> dict[str, tuple[bool, str]]:
    """name -> (is a package, source): the packages as empty shells (fatpipe.trainer's own
    __init__ may want torch), the staging modules as they are here."""
    sent = {"fatpipe": (True, ""), "fatpipe.trainer": (True, ""),
            "fatpipe.trainer.staging": (True, (STAGING / "__init__.py").read_text())}
    for name in SENT_MODULES:
        sent[f"fatpipe.trainer.staging.{name}"] = (False, (STAGING / f"{name}.py").read_text())
    return sent


def boot_command(python: str) -> str:
    """The shell text that starts the program in the current folder (fixed text and a quoted python)."""
    return f"exec {shlex.quote(python)} -c {shlex.quote(BOOT.read_text())}"


def program_line(main: str, argv: list[str], files: dict[str, str] | None = None, env: dict[str, str] | None = None,
                 watch: bool = False) -> str:
    """The one line on the program's standard input: what it imports, writes and runs."""
    return json.dumps({"modules": modules(), "files": files or {}, "env": env or {}, "main": main,
                       "argv": argv, "watch": watch}) + "\n"
