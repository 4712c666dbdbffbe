"""The commands the README's tour and the guides show, read from their fenced shell blocks.

A block (```sh, ```bash, or ```console, whose commands follow a `$ ` prompt) is run on the sim by
tests/system/test_doc_commands.py unless the line before it is `<!-- not run: REASON -->`; every
`fatpipe` line is parsed against the real CLI either way (tests/unit/test_doc_commands.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHELL_FENCES = ("sh", "bash", "console")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.+?)\s*-->$")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}
PROGRAMS = ("fatpipe", "make")


@dataclass(frozen=True)
class DocCommand:
    """One command line of a doc block: `program` and its arguments, the `VAR=value` prefixes,
    where it is written, and why it is not run on the sim (None: it is)."""

    source: str
    program: str
    args: tuple[str, ...]
    env: dict = field(default_factory=dict, hash=False, compare=False)
    not_run: str | None = None

    def __str__(self) -> str:
        return f"{self.source}: {shlex.join([self.program, *self.args])}"


def doc_files() -> list[Path]:
    """README.md and every guide under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def doc_commands(paths: list[Path] | None = None) -> list[DocCommand]:
    found: list[DocCommand] = []
    for path in paths if paths is not None else doc_files():
        found += commands_in(path.read_text(), str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path))
    return found


def commands_in(text: str, source: str) -> list[DocCommand]:
    """The `fatpipe` and `make` lines of `text`'s shell blocks, in order."""
    found: list[DocCommand] = []
    lines = text.splitlines()
    fence: str | None = None
    reason: str | None = None
    previous = ""
    pending = ""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is None:
            if stripped.startswith("```"):
                fence = stripped[3:].strip() or "text"
                mark = NOT_RUN.match(previous)
                reason = mark["reason"] if mark else None
            elif stripped:
                previous = stripped
            continue
        if stripped.startswith("```"):
            fence, previous = None, ""
            continue
        if fence not in SHELL_FENCES:
            continue
        if fence == "console":
            if not stripped.startswith("$ "):
                continue
            stripped = stripped[2:]
        if stripped.endswith("\\"):  # a continued line
            pending += stripped[:-1] + " "
            continue
        command = parse_line(pending + stripped, f"{source}:{number}", reason)
        pending = ""
        if command is not None:
            found.append(command)
    return found


def parse_line(line: str, source: str, not_run: str | None) -> DocCommand | None:
    """The command a shell line runs first, when it is `fatpipe` or `make` (None otherwise)."""
    tokens = shlex.split(line, comments=True)
    cut = next((i for i, t in enumerate(tokens) if t in SHELL_OPERATORS), len(tokens))
    tokens = tokens[:cut]
    env = {}
    while tokens and ENV_ASSIGNMENT.match(tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        env[name] = value
    if not tokens or tokens[0] not in PROGRAMS:
        return None
    return DocCommand(source, tokens[0], tuple(tokens[1:]), env, not_run)
