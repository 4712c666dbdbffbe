"""Start-up time of `fatpipe --help`, of every command's `--help` and of commands that need no cloud SDK,
against a bare interpreter that imports click, measured side by side.

A command's help imports its declaration alone (cli/declare.py), its body when it runs: each
`<command> --help` should cost about what `fatpipe --help` does. Prints, per case, the median wall
and CPU time of interleaved runs (machine noise hits every case alike) and the ratio of its median
wall time to the baseline's; the no-SDK commands run in a fresh project of one sim cluster. Writes
bench/out/startup.json. Goal: `fatpipe --help` well under 0.5 s.

Usage: .venv/bin/python bench/startup.py [--runs 15] [--out bench/out]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fatpipe.cli.main import COMMANDS

BASELINE = "python -c 'import click'"
FATPIPE = [sys.executable, "-m", "fatpipe.cli"]
# Commands that read the project and its files only: no cloud SDK, no node, no torch.
NO_SDK = ("config", "status", "runs", "catalog aws --offline", "plan --nodes 2-4")


def cases() -> dict[str, list[str]]:
    found = {BASELINE: [sys.executable, "-c", "import click"], "fatpipe --help": [*FATPIPE, "--help"]}
    found |= {f"fatpipe {name} --help": [*FATPIPE, name, "--help"] for name in COMMANDS}
    found |= {f"fatpipe {line}": [*FATPIPE, *line.split()] for line in NO_SDK}
    return found


def measure(cmd: list[str], cwd: str) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one run of `cmd`."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(cmd, cwd=cwd, capture_output=True, env={**os.environ, "NO_COLOR": "1"})
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as project:
        subprocess.run([*FATPIPE, "init", "--provider", "sim"], cwd=project, check=True, capture_output=True)
        runs = {name: ([], []) for name in cases()}
        for round_ in range(args.runs + 1):  # round 0 compiles and warms the page cache: not counted
            for name, cmd in cases().items():
                wall, cpu = measure(cmd, project)
                if round_:
                    runs[name][0].append(wall)
                    runs[name][1].append(cpu)
    base = statistics.median(runs[BASELINE][0])
    result = {}
    for name, (walls, cpus) in runs.items():
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        result[name] = {"wall_s": wall, "cpu_s": cpu, "ratio": wall / base, "runs": len(walls)}
        print(f"{name:42s} median {wall * 1000:7.1f} ms  cpu {cpu * 1000:7.1f} ms  ratio {wall / base:5.2f}")
    help_s = result["fatpipe --help"]["wall_s"]
    print(f"goal: fatpipe --help < 500 ms -> {'met' if help_s < 0.5 else 'NOT met'} ({help_s * 1000:.0f} ms)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps({"baseline": BASELINE, "cases": result}, indent=2) + "\n")
    print(f"wrote {args.out / 'startup.json'}")


if __name__ == "__main__":
    main()
