"""Synth cost of fatpipe's AWS stack relative to a bare cdktf app with the same provider.

Each measurement is a fresh Python process (import + build + synth, as `fatpipe synth` and
`cdktf synth` run it), repeated, interleaved and rotated so drift hits every variant alike; the median
is reported. Goal: an 8- and a 64-node AWS cluster within 1.15 x the bare app. Wall time is
the goal's measure; CPU time (the process and its jsii Node child) is printed beside it,
because on a shared machine other people's load moves wall time but not CPU time.

    .venv/bin/python bench/synth.py [--reps 3] [--out bench/out]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

GOAL = 1.15

BARE = """
from cdktf import App, TerraformStack
from cdktf_cdktf_provider_aws.provider import AwsProvider
from cdktf_cdktf_provider_aws.vpc import Vpc
app = App(outdir={outdir!r})
stack = TerraformStack(app, "bare")
AwsProvider(stack, "aws", region="us-east-1")
Vpc(stack, "vpc", cidr_block="10.42.0.0/24")
app.synth()
"""

FATPIPE = """
from fatpipe.infra.project import load_project
from fatpipe.stacks.app import synth
synth(load_project({config!r}), [{name!r}], outdir={outdir!r})
"""

PROJECT = """
[clusters.{name}]
provider = "aws"
region = "us-east-1"
nodes = {nodes}
tier = "10g"
ssh_public_key = "{key}"
ssh_cidr = "203.0.113.7/32"
"""


def write_project(folder: Path, sizes: list[int]) -> Path:
    key = folder / "bench_key.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchmarkKeyOnlyForSynthNotForLogin bench\n")
    config = folder / "fatpipe.toml"
    config.write_text("".join(PROJECT.format(name=f"n{n}", nodes=n, key=key) for n in sizes))
    return config


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(code: str) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh process running `code`."""
    env = dict(os.environ, JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="16,18,20",
               JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1")
    cpu, start = cpu_of_children(), time.perf_counter()
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, cpu_of_children() - cpu


def measure(reps: int, sizes: list[int]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    times: dict[str, list[float]] = {"bare": [], **{f"fatpipe-{n}": [] for n in sizes}}
    cpu: dict[str, list[float]] = {k: [] for k in times}
    with tempfile.TemporaryDirectory(prefix="fatpipe-bench-") as tmp:
        folder = Path(tmp)
        config = write_project(folder, sizes)
        codes = {"bare": BARE.format(outdir=str(folder / "bare.out"))}
        for n in sizes:
            codes[f"fatpipe-{n}"] = FATPIPE.format(config=str(config), name=f"n{n}",
                                                   outdir=str(folder / f"n{n}.out"))
        order = list(codes)
        for rep in range(reps):
            # Rotate who goes first, so a cold cache or a neighbour's burst is shared out evenly.
            for name in order[rep % len(order):] + order[:rep % len(order)]:
                code = codes[name]
                wall, used = timed(code)
                times[name].append(wall)
                cpu[name].append(used)
            print(f"rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items()),
                  file=sys.stderr)
    return times, cpu


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["median_s"])
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(names, [result["median_s"][n] for n in names], color=["grey"] + ["tab:blue"] * (len(names) - 1))
    ax.axhline(result["median_s"]["bare"] * GOAL, color="tab:red", linestyle="--", label=f"goal {GOAL}x bare")
    ax.set_ylabel("seconds (median, fresh process)")
    ax.set_title("cdktf synth: fatpipe AWS stack vs bare app")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()

    times, cpu = measure(args.reps, args.sizes)
    median = {k: statistics.median(v) for k, v in times.items()}
    median_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    ratio = {k: median[k] / median["bare"] for k in median if k != "bare"}
    ratio_cpu = {k: median_cpu[k] / median_cpu["bare"] for k in median_cpu if k != "bare"}
    result = {
        "bench": "synth", "date": time.strftime("%Y-%m-%d"), "reps": args.reps, "goal_ratio": GOAL,
        "python": platform.python_version(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
        "times_s": times, "median_s": median, "ratio_to_bare": ratio,
        "cpu_s": cpu, "median_cpu_s": median_cpu, "cpu_ratio_to_bare": ratio_cpu,
    }
    print(f"{'variant':<12} {'wall s':>7} {'ratio':>6} {'cpu s':>7} {'ratio':>6}")
    print(f"{'bare':<12} {median['bare']:>7.2f} {'1.00':>6} {median_cpu['bare']:>7.2f} {'1.00':>6}")
    for name, r in ratio.items():
        verdict = "ok" if r <= GOAL else f"over goal {GOAL}"
        print(f"{name:<12} {median[name]:>7.2f} {r:>6.2f} {median_cpu[name]:>7.2f} {ratio_cpu[name]:>6.2f}  {verdict}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "synth.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "synth.png")
    print(f"wrote {args.out / 'synth.json'} and {args.out / 'synth.png'}")
    return 0 if all(r <= GOAL for r in ratio.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
