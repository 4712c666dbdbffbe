"""Every command the README's tour and the guides show is one the CLI takes: each command and
flag exists and each value converts, as click and the [train] validation read them when a user
types the line. (tests/system/test_doc_commands.py runs them on a sim cluster.)"""

from __future__ import annotations

import re

import click
import pytest
from doccommands import REPO, commands_in, doc_commands, doc_files

from fatpipe.infra.errors import FatpipeError

COMMANDS = doc_commands()
FATPIPE = [c for c in COMMANDS if c.program == "fatpipe"]
GUIDES = [p for p in doc_files() if p.parent.name == "docs" and p.name not in ("ARCHITECTURE.md", "BENCHMARKS.md")]


def parse(args: tuple[str, ...]) -> click.Context:
    """The context click builds for `fatpipe ARGS`, down to the leaf command, without running it;
    a problem raises click's UsageError (or a FatpipeError for a [train] value)."""
    from fatpipe.cli.main import cli
    from fatpipe.infra.trainspec import TrainSpec

    command, name, rest, parent = cli, "fatpipe", list(args), None
    while True:
        ctx = command.make_context(name, rest, parent=parent)
        if not isinstance(command, click.Group):
            break
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            raise click.UsageError(f"`{name}` needs a command", ctx)
        name, command, rest = command.resolve_command(ctx, rest)
        parent = ctx
    overrides = ctx.meta.get("train", {})
    if overrides:
        try:
            TrainSpec.model_validate({**TrainSpec().model_dump(), **overrides})
        except ValueError as e:
            raise FatpipeError(f"[train] override: {e}") from None
    return ctx


def problem(args: tuple[str, ...]) -> str | None:
    try:
        parse(args)
    except (click.ClickException, FatpipeError) as e:
        return e.format_message() if isinstance(e, click.ClickException) else str(e)
    return None


def test_the_docs_show_commands_to_check():
    readme = [c for c in FATPIPE if c.source.startswith("README.md")]
    assert len(readme) >= 12 and len(FATPIPE) >= 40
    assert {c.source.split(":")[0] for c in FATPIPE} >= {"README.md", "docs/data.md", "docs/results.md",
                                                         "docs/netcheck.md", "docs/clouds-and-plan.md"}


@pytest.mark.parametrize("command", FATPIPE, ids=str)
def test_every_fatpipe_line_parses(command):
    assert problem(command.args) is None, f"{command}: {problem(command.args)}"


def test_every_make_line_names_a_target():
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.M))
    lines = [c for c in COMMANDS if c.program == "make"]
    assert lines
    for command in lines:
        named = [a for a in command.args if not a.startswith("-") and "=" not in a]
        assert named and set(named) <= targets, f"{command}: no such target in the Makefile"


@pytest.mark.parametrize("line", [
    "fatpipe up --stepz 60",                       # a misspelt flag
    "fatpipe up --preset huge",                    # a value the choice does not hold
    "fatpipe up --steps sixty",                    # not a number
    "fatpipe up --steps 0",                        # outside [train]'s range
    "fatpipe netcheck --quick --pairz",
    "fatpipe data pusj demo",                      # a subcommand that does not exist
    "fatpipe data",                                # a group without its command
    "fatpipe deployy",
    "fatpipe plan --nodes 8 --by speed",
    "fatpipe pull",                                # a required argument missing
])
def test_a_wrong_line_is_caught(line):
    [command] = commands_in(f"```sh\n{line}\n```\n", "doc.md")
    assert problem(command.args) is not None


def test_blocks_prompts_marks_and_pipes_are_read_as_a_user_reads_them():
    text = """\
```console
$ fatpipe status demo --json | jq .run
{"id": "x"}
```

<!-- not run: needs an AWS account -->
```sh
FATPIPE_TOOLKIT=cdktn fatpipe synth   # a comment
fatpipe up aws \\
  --preset tiny
torchrun train.py
```

```toml
fatpipe = "not a command"
```

```text
fatpipe up --not-a-command-here
```
"""
    found = commands_in(text, "doc.md")
    assert [(c.args, c.env, c.not_run) for c in found] == [
        (("status", "demo", "--json"), {}, None),
        (("synth",), {"FATPIPE_TOOLKIT": "cdktn"}, "needs an AWS account"),
        (("up", "aws", "--preset", "tiny"), {}, "needs an AWS account"),
    ]


def test_every_guide_starts_with_what_a_user_wants():
    assert len(GUIDES) >= 8
    for guide in GUIDES:
        lines = guide.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("You want"), guide.name


def test_every_relative_link_in_the_docs_resolves():
    pages = [*doc_files(), *REPO.glob("*/README.md"), *REPO.glob("docs/design/*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == []


# A citation of the architecture by section: the file's path, a comma, the section's title quoted
# (wrapped over lines, in a comment too).
CITATION = re.compile(r'docs/ARCHITECTURE\.md[,;]\s*"([^"]+)"')
CITING = ("infra", "stacks", "ops", "node", "cli", "trainer", "tests", "bench", "docs", "examples")


def test_every_section_the_code_cites_is_in_the_architecture():
    headings = set(re.findall(r"^#+ (.+)$", (REPO / "docs" / "ARCHITECTURE.md").read_text(), re.M))
    pages = [REPO / "README.md", *(p for d in CITING for p in (REPO / d).rglob("*") if p.suffix in (".py", ".md"))]
    missing = []
    for page in pages:
        for match in CITATION.finditer(page.read_text()):
            title = re.sub(r"\s*\n\s*#?\s*", " ", match[1]).strip()
            if title not in headings:
                missing.append(f"{page.relative_to(REPO)}: {title}")
    assert missing == []


def test_the_readme_stays_a_five_minute_read():
    assert len((REPO / "README.md").read_text().splitlines()) < 200
