"""The two lanes of `make test`, assigned by a rule rather than by hand.

Each test module's measured seconds live in tests/durations.json (the unit tests count as one item,
`tests/unit`); the items are dealt longest first onto the lane with the fewer seconds so far (the
greedy split), and a module absent from the file costs DEFAULT_S. Standard library only: the
Makefile runs it with the system interpreter. The first file came from a CI run's slowest tests and
each lane's total (the rest of a lane's time spread over its other tests); `--update` puts a run's
own figures in their place.

    python3 tests/lanes.py 1          the paths of lane one (lane two: 2), as `make test` runs them
    python3 tests/lanes.py --update OUTPUT...
                                      fold a run's measurements into tests/durations.json: a junit
                                      XML file (pytest --junitxml=...) or a run's printed output
                                      with `--durations=0` (e.g. `make test LANE_ARGS=--durations=0`)
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "tests" / "durations.json"
UNIT = "tests/unit"
DEFAULT_S = 60.0  # a new system module: about what a real sim cluster's test takes
LANES = 2
# `--durations=0` lines: "12.34s call     tests/system/test_x.py::test_y[param]"
DURATION_LINE = re.compile(r"^\W*([\d.]+)s (?:setup|call|teardown)\s+(tests/\S+?\.py)::")


def items(root: Path = ROOT) -> list[str]:
    """What the lanes run: the unit tests as one item and each system test module."""
    system = sorted(p.relative_to(root).as_posix() for p in (root / "tests" / "system").glob("test_*.py"))
    return [UNIT, *system]


def item_of(path: str) -> str:
    return UNIT if path.startswith(UNIT + "/") else path


def split(costs: dict[str, float], names: list[str], lanes: int = LANES) -> list[list[str]]:
    """Longest first onto the lane with the fewest seconds so far; ties go to the lower lane."""
    loads = [0.0] * lanes
    chosen: list[list[str]] = [[] for _ in range(lanes)]
    for name in sorted(names, key=lambda n: (-costs.get(n, DEFAULT_S), n)):
        lane = loads.index(min(loads))
        loads[lane] += costs.get(name, DEFAULT_S)
        chosen[lane].append(name)
    return [sorted(lane) for lane in chosen]


def measured(text: str, root: Path = ROOT) -> dict[str, float]:
    """Seconds per item from a junit XML document or from `--durations=0` lines."""
    seconds: dict[str, float] = {}
    if text.lstrip().startswith("<"):
        for case in ET.fromstring(text).iter("testcase"):
            path = module_path(case.get("classname", ""), root)
            if path:
                seconds[item_of(path)] = seconds.get(item_of(path), 0.0) + float(case.get("time") or 0)
        return seconds
    for line in text.splitlines():
        m = DURATION_LINE.match(line)
        if m:
            seconds[item_of(m.group(2))] = seconds.get(item_of(m.group(2)), 0.0) + float(m.group(1))
    return seconds


def module_path(classname: str, root: Path) -> str | None:
    """junit's classname (tests.system.test_x or tests.system.test_x.TestY) as the module's path."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (root / path).is_file():
            return path
    return None


def load(path: Path = DURATIONS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


def update(outputs: list[str], path: Path = DURATIONS) -> dict[str, float]:
    """The measured items replace their entries; the rest keep theirs. Written whole or not at all."""
    fresh: dict[str, float] = {}
    for output in outputs:
        for name, s in measured(Path(output).read_text(errors="replace")).items():
            fresh[name] = fresh.get(name, 0.0) + s
    if not fresh:
        raise SystemExit(f"error: no test durations in {', '.join(outputs)} (junit XML or --durations=0 output)")
    costs = {**load(path), **{n: round(s, 1) for n, s in fresh.items()}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(costs.items())), indent=1) + "\n")
    tmp.replace(path)
    return costs


def main(argv: list[str]) -> int:
    if argv[:1] == ["--update"] and argv[1:]:
        costs = update(argv[1:])
        for lane, names in enumerate(split(costs, items()), 1):
            print(f"lane {lane}: {sum(costs.get(n, DEFAULT_S) for n in names):.0f} s, {len(names)} items")
        return 0
    if len(argv) == 1 and argv[0] in {str(n) for n in range(1, LANES + 1)}:
        print(" ".join(split(load(), items())[int(argv[0]) - 1]))
        return 0
    print(f"usage: {Path(__file__).name} 1|2 | --update OUTPUT...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
