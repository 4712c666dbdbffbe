"""Synth cost per toolkit: import and synth time of fatpipe's AWS stack and of a bare app with the
same provider, CDK for Terraform (cdktf) and CDK Terrain (cdktn) side by side in one run.

Each measurement is a fresh Python process (import + build + synth, as `fatpipe synth` and
`cdktf synth` run it), repeated, interleaved and rotated so drift hits every variant and toolkit
alike; the median is reported. The child times two phases itself: import (the toolkit's core and
its AWS bindings package: the jsii kernel's start and the assemblies' load) and synth (everything
after: the stack's own modules and bindings submodules, build, write). Wall and CPU time (the
process and its jsii Node child) come from the parent; CPU time is printed because on a shared
machine other people's load moves wall time but not CPU time.

Goal, per toolkit: an 8- and a 64-node AWS cluster within 1.15 x the bare app of the same toolkit
(wall). The cdktn/cdktf ratios are reported, not judged.

    .venv/bin/python bench/synth.py [--reps 3] [--toolkits cdktf cdktn] [--out bench/out]
"""

from __future__ import annotations

import argparse
import importlib.util
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
from importlib.metadata import version
from pathlib import Path

GOAL = 1.15
MEASURES = ("import", "synth", "wall", "cpu")
# Per toolkit: its core and prebuilt AWS bindings (module, distribution). fatpipe's own stacks pick
# theirs through fatpipe.stacks.toolkit from FATPIPE_TOOLKIT.
TOOLKITS = {
    "cdktf": ("cdktf", "cdktf_cdktf_provider_aws", "cdktf-cdktf-provider-aws"),
    "cdktn": ("cdktn", "cdktn_provider_aws", "cdktn-provider-aws"),
}

IMPORT = """
import json, time
t0 = time.perf_counter()
import {core}, {aws}
t1 = time.perf_counter()
"""

REPORT = """
print(json.dumps({"import": t1 - t0, "synth": time.perf_counter() - t1}))
"""

BARE = """
from {core} import App, TerraformStack
from {aws}.provider import AwsProvider
from {aws}.vpc import Vpc
app = App(outdir={outdir!r})
stack = TerraformStack(app, "bare")
AwsProvider(stack, "aws", region="us-east-1")
Vpc(stack, "vpc", cidr_block="10.42.0.0/24")
app.synth()
"""

FATPIPE = """
from fatpipe.infra.project import load_project
from fatpipe.stacks.app import synth
project = load_project({config!r})
synth(project, [project.cluster({name!r})], outdir={outdir!r})
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


def installed(toolkit: str) -> bool:
    core, aws, _ = TOOLKITS[toolkit]
    return all(importlib.util.find_spec(m) for m in (core, aws))


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(code: str, toolkit: str) -> dict[str, float]:
    """The phases one fresh process running `code` under `toolkit` reports, plus its wall and CPU."""
    env = dict(os.environ, FATPIPE_TOOLKIT=toolkit, JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="16,18,20",
               JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1")
    cpu, start = cpu_of_children(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wall, used = time.perf_counter() - start, cpu_of_children() - cpu
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall": wall, "cpu": used}


def programs(folder: Path, sizes: list[int], toolkits: list[str]) -> dict[tuple[str, str], str]:
    """{(toolkit, variant): the child's code}."""
    config = write_project(folder, sizes)
    codes = {}
    for toolkit in toolkits:
        core, aws, _ = TOOLKITS[toolkit]
        head = IMPORT.format(core=core, aws=aws)
        codes[toolkit, "bare"] = head + BARE.format(core=core, aws=aws, outdir=str(folder / f"{toolkit}-bare")) + REPORT
        for n in sizes:
            body = FATPIPE.format(config=str(config), name=f"n{n}", outdir=str(folder / f"{toolkit}-n{n}"))
            codes[toolkit, f"fatpipe-{n}"] = head + body + REPORT
    return codes


def measure(reps: int, sizes: list[int], toolkits: list[str]) -> dict:
    """{toolkit: {variant: {measure: [seconds per rep]}}}."""
    with tempfile.TemporaryDirectory(prefix="fatpipe-bench-") as tmp:
        codes = programs(Path(tmp), sizes, toolkits)
        runs: dict = {t: {v: {m: [] for m in MEASURES} for (tk, v) in codes if tk == t} for t in toolkits}
        order = list(codes)
        for rep in range(reps):
            # Rotate who goes first, so a cold cache or a neighbour's burst is shared out evenly.
            for toolkit, variant in order[rep % len(order):] + order[:rep % len(order)]:
                for key, value in timed(codes[toolkit, variant], toolkit).items():
                    runs[toolkit][variant][key].append(value)
            print(f"rep {rep + 1}/{reps}: " + ", ".join(
                f"{t} {v} {runs[t][v]['wall'][-1]:.1f}s" for t, v in order), file=sys.stderr)
    return runs


def summarize(runs: dict) -> dict:
    median = {t: {v: {m: statistics.median(s) for m, s in ms.items()} for v, ms in vs.items()}
              for t, vs in runs.items()}
    to_bare = {t: {v: {m: ms[m] / vs["bare"][m] for m in ("wall", "cpu")} for v, ms in vs.items() if v != "bare"}
               for t, vs in median.items()}
    across = {}
    if {"cdktf", "cdktn"} <= set(median):
        across = {v: {m: median["cdktn"][v][m] / median["cdktf"][v][m] for m in MEASURES}
                  for v in median["cdktf"]}
    return {"median_s": median, "ratio_to_bare": to_bare, "ratio_cdktn_to_cdktf": across}


def print_table(summary: dict, versions: dict) -> None:
    median, across = summary["median_s"], summary["ratio_cdktn_to_cdktf"]
    kits = list(median)
    print("toolkits: " + " | ".join(f"{t} {v['core']} + {TOOLKITS[t][2]} {v['aws']}" for t, v in versions.items()))
    print(f"{'variant':<12} {'measure':<7} " + " ".join(f"{t + ' s':>8}" for t in kits)
          + (f" {'cdktn/cdktf':>11}" if across else ""))
    for variant in median[kits[0]]:
        for m in MEASURES:
            row = f"{variant:<12} {m:<7} " + " ".join(f"{median[t][variant][m]:>8.2f}" for t in kits)
            print(row + (f" {across[variant][m]:>11.2f}" if across else ""))
    print(f"goal: fatpipe's wall time within {GOAL} x the bare app of the same toolkit (cpu beside it)")
    for toolkit, ratios in summary["ratio_to_bare"].items():
        print(f"  {toolkit}: " + ", ".join(
            f"{v} {r['wall']:.2f} (cpu {r['cpu']:.2f}) {'ok' if r['wall'] <= GOAL else 'over goal'}"
            for v, r in ratios.items()))


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    median = summary["median_s"]
    kits, variants = list(median), list(next(iter(median.values())))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    width = 0.8 / len(kits)
    for i, toolkit in enumerate(kits):
        xs = [j + i * width for j in range(len(variants))]
        phases = [median[toolkit][v] for v in variants]
        imports = [p["import"] for p in phases]
        done = [p["import"] + p["synth"] for p in phases]
        ax.bar(xs, imports, width, color=f"C{i}", label=f"{toolkit} import")
        ax.bar(xs, [p["synth"] for p in phases], width, bottom=imports, color=f"C{i}", alpha=0.6,
               label=f"{toolkit} synth")
        ax.bar(xs, [p["wall"] - d for p, d in zip(phases, done, strict=True)], width, bottom=done,
               color=f"C{i}", alpha=0.25)
    ax.set_xticks([j + width * (len(kits) - 1) / 2 for j in range(len(variants))], variants)
    ax.set_ylabel("seconds (median, fresh process)")
    ax.set_title("synth: cdktf vs cdktn (pale: interpreter start and exit)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--toolkits", nargs="+", choices=list(TOOLKITS), default=None,
                        help="default: every installed one")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()
    toolkits = args.toolkits or [t for t in TOOLKITS if installed(t)]
    missing = [t for t in toolkits if not installed(t)]
    if missing:
        parser.error(f"not installed: {', '.join(missing)} (the cdktn extra: pip install -e '.[cdktn]')")
    versions = {t: {"core": version(TOOLKITS[t][0]), "aws": version(TOOLKITS[t][2])} for t in toolkits}

    runs = measure(args.reps, args.sizes, toolkits)
    summary = summarize(runs)
    result = {
        "bench": "synth", "date": time.strftime("%Y-%m-%d"), "reps": args.reps, "goal_ratio": GOAL,
        "python": platform.python_version(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
        "toolkits": versions, "runs_s": runs, **summary,
    }
    print_table(summary, versions)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "synth.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(summary, args.out / "synth.png")
    print(f"wrote {args.out / 'synth.json'} and {args.out / 'synth.png'}")
    ok = all(r["wall"] <= GOAL for ratios in summary["ratio_to_bare"].values() for r in ratios.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
