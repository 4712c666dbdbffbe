"""One vocabulary: an option name means the same thing (type, default) in every command, and no two
names for one idea. Walks every command of `fatpipe --help` (cli/main.py COMMANDS) by click's own
introspection, subcommands included."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[2]

# Names that would mean the same thing: at most one of each group may appear in the whole CLI.
SYNONYMS = [
    {"--out", "--run-dir", "--output-dir", "--dir", "--folder"},
    {"--yes", "--assume-yes", "--no-confirm", "--auto-approve", "--non-interactive"},
    {"--run", "--run-id"},
    {"--json", "--as-json", "--format"},
    {"--verbose", "--debug", "--loud"},
    {"--timeout", "--time-limit", "--deadline"},
    {"--wait-timeout", "--wait", "--ready-timeout"},
    {"--down-after", "--destroy-after", "--teardown", "--down"},
    {"--node", "--host"},
    {"--engine", "--tool", "--binary"},
    {"--nproc-per-node", "--nproc", "--procs"},
    {"--keep", "--retain", "--last"},
    {"--quick", "--fast", "--smoke", "--netcheck"},
    {"--no-gate", "--ignore-gate", "--force-train"},
]
# The one accepted pair, both documented: `netcheck --quick` and `up --netcheck quick` (up's flag
# also takes full and off, which a netcheck flag cannot).
ALLOWED = [{"--quick", "--netcheck"}]


def commands() -> list[tuple[str, click.Command]]:
    from fatpipe.cli.main import COMMANDS, cli

    ctx = click.Context(cli)
    found = []

    def walk(path: str, command: click.Command) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(f"{path} {name}", sub)
        else:
            found.append((path, command))

    for name in COMMANDS:
        walk(name, cli.get_command(ctx, name))
    return found


def options() -> list[tuple[str, click.Option]]:
    return [(path, p) for path, c in commands() for p in c.params
            if isinstance(p, click.Option) and not p.hidden]


def kind(param: click.Option) -> tuple:
    """What an option accepts: its type with its bounds or choices, flag-ness, multiplicity."""
    t = param.type
    detail = ()
    if isinstance(t, click.Choice):
        detail = tuple(t.choices)
    elif isinstance(t, (click.IntRange, click.FloatRange)):
        detail = (t.min, t.max, t.min_open, t.max_open)
    elif isinstance(t, click.Path):
        detail = (t.file_okay, t.dir_okay, t.exists)
    return type(t).__name__, detail, param.is_flag, param.multiple


def long_names(param: click.Option) -> list[str]:
    return [o for o in param.opts if o.startswith("--")]


def test_the_walk_sees_every_command_and_subcommand():
    paths = {path for path, _ in commands()}
    assert {"up", "netcheck", "down", "runs list", "runs prune", "status"} <= paths


def test_an_option_name_has_one_type_and_one_default_everywhere():
    seen: dict[str, dict[tuple, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path, param in options():
        for name in long_names(param):
            seen[name][(kind(param), repr(param.default))].append(path)
    clashes = [f"{name}: " + "; ".join(f"{sig} in {', '.join(paths)}" for sig, paths in sigs.items())
               for name, sigs in seen.items() if len(sigs) > 1]
    assert not clashes, "\n".join(clashes)


def test_a_short_flag_stands_for_the_same_long_one_everywhere():
    seen: dict[str, set[str]] = defaultdict(set)
    for _, param in options():
        for short in (o for o in param.opts if not o.startswith("--")):
            seen[short].update(long_names(param))
    assert {short: longs for short, longs in seen.items() if len(longs) > 1} == {}


def test_no_synonyms():
    names = {name for _, param in options() for name in long_names(param)}
    found = [group & names for group in SYNONYMS if len(group & names) > 1]
    assert [f for f in found if f not in ALLOWED] == []
    # Nor one option under two long names (a --x/--no-x switch is one name).
    doubled = [(path, long_names(p)) for path, p in options() if len(long_names(p)) > 1]
    assert doubled == []


def test_quick_and_netcheck_quick_are_both_documented():
    from fatpipe.cli.main import cli

    ctx = click.Context(cli)
    up = {p.name: p for p in cli.get_command(ctx, "up").params}
    netcheck = {p.name: p for p in cli.get_command(ctx, "netcheck").params}
    assert "quick" in up["netcheck_mode"].type.choices and "quick" in up["netcheck_mode"].help
    assert "up --netcheck quick" in netcheck["quick"].help
    docs = "".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    assert "--netcheck quick" in docs and "netcheck --quick" in docs


def test_the_check_itself_catches_a_clash():
    a = click.Option(["--timeout"], type=click.FloatRange(1), default=None)
    b = click.Option(["--timeout"], type=click.FloatRange(1), default=600.0)
    assert (kind(a), repr(a.default)) != (kind(b), repr(b.default))
    assert kind(a) != kind(click.Option(["--timeout"], type=int))
