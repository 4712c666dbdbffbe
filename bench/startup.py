"""Start-up time of `fatpipe --help` against a bare interpreter, measured side by side.

Goal: `fatpipe --help` well under 0.5 s. Prints medians of interleaved runs and their ratio.
Usage: python bench/startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "fatpipe --help": [sys.executable, "-m", "fatpipe.cli", "--help"],
}


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):  # interleaved, so machine noise hits both alike
        for name, cmd in COMMANDS.items():
            times[name].append(wall(cmd))
    base = statistics.median(times["python -c pass"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:16s} median {median * 1000:7.1f} ms   ratio to bare python {median / base:5.2f}")
    help_s = statistics.median(times["fatpipe --help"])
    print(f"goal: fatpipe --help < 500 ms -> {'met' if help_s < 0.5 else 'NOT met'} ({help_s * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
