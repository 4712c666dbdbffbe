"""`fatpipe plan`: rank provider x machine type x tier x node count for a training job."""

from __future__ import annotations

import json
import re

import click
from rich import box
from rich.table import Table

from fatpipe.infra.accelerators import accelerator
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.jobmodel import DEFAULT_TOKENS_PER_STEP, Job
from fatpipe.infra.planwrite import MACHINE_KEY, add_cluster, cluster_block
from fatpipe.ops.plan import plan as planner
from fatpipe.ops.plan.measured import measured_candidates
from fatpipe.ops.plan.plan import parse_count

from .options import console, pass_project


def parse_nodes(text: str) -> range:
    """`8` or `2-8` (inclusive), at least 2 nodes."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m:
        raise ConfigError(f"--nodes: {text!r} is not a count such as 8 or a range such as 2-8")
    low, high = int(m.group(1)), int(m.group(2) or m.group(1))
    if low < 2 or high < low or high > 256:
        raise ConfigError(f"--nodes: {text!r} must be 2 or more nodes, low-high, at most 256")
    return range(low, high + 1)


def plan_regions(span: str, regions: int | None, count: range) -> int:
    """How many regions the nodes split into: `--regions` (with `--span regions` alone), else two."""
    if regions is None:
        return planner.PLANNED_REGIONS
    if span != "regions":
        raise ConfigError(f"--regions {regions} needs --span regions (the nodes are {span!r} apart)")
    if not 2 <= regions <= count.stop - 1:
        raise ConfigError(f"--regions must be 2 or more and at most the largest node count "
                          f"({count.stop - 1}), not {regions}")
    return regions


@pass_project(clusters_optional=True)
def plan(project, **opts):
    """The body of `fatpipe plan`; its options and help are declared in cluster_commands.py."""
    count = parse_nodes(opts["nodes"])
    if opts["top"] < 1:
        raise ConfigError(f"--top must be 1 or more, not {opts['top']}")
    traffic = planner.model_traffic(opts["model"])
    job = _job(traffic.params, opts)
    acc = accelerator(opts["accel"], opts["tokens_per_s"])
    # --link alone plans those links; the catalogs join when a --catalog names them.
    providers = opts["providers"] or (() if opts["links"] else planner.PROVIDERS)
    regions = plan_regions(opts["span"], opts["regions"], count)
    if opts["span"] == "regions":
        count = range(max(count.start, regions), count.stop)  # no fewer nodes than regions
    cands = planner.candidates(acc, count, providers,
                               opts["tiers"] or ("1g", "10g", "25g"), project.root, opts["span"], regions)
    cands += planner.link_candidates(list(opts["links"]), count) + measured_candidates(project)
    if not cands:
        need = "no GPU" if acc is not None and not acc.gpus else "a GPU"
        raise ConfigError(f"no machine type with {need} reaches the tiers asked; try another "
                          "--catalog, --tier or --accelerator, or give --link")
    by = opts["by"]
    ranked = planner.plan(job, acc, traffic, cands, by, bool(opts["auto_periodic"]))
    left = planner.unranked(cands, acc)
    if not ranked:
        raise ConfigError(f"no machine type has a sourced figure for its GPU ({_reasons(left)}); "
                          "give --accelerator NAME or --tokens-per-s")
    written = _write(project, opts["write_name"], ranked) if opts["write_name"] else None
    if written and not opts["as_json"]:
        console(stderr=True).print(f"wrote \\[clusters.{written['cluster']}] to {written['path']}: "
                                   f"{written['provider']} {written['machine']} x "
                                   f"{written['nodes']}, tier {written['tier']}")
    ranked = ranked[: opts["top"]]
    if opts["as_json"]:
        click.echo(json.dumps(_doc(opts["model"], job, acc, by, ranked, left, written), indent=1))
    else:
        _show(opts["model"], job, acc, by, ranked, left)


def _used(ranked) -> list:
    """The accelerators of the rows shown, once each, in row order."""
    return list({(p.accel.kind, p.accel.name): p.accel for p in ranked}.values())


def _doc(model: str, job, acc, by: str, ranked, left, written) -> dict:
    return {"job": {"model": model, "params": job.params, "tokens": job.tokens,
                    "tokens_per_step": job.tokens_per_step, "steps": job.steps},
            "accelerator": _accel_dict(acc) if acc else None, "by": by,
            "accelerators": {a.kind or a.name: _accel_dict(a) for a in _used(ranked)},
            "plans": [p.to_dict() for p in ranked], "unranked": [u.to_dict() for u in left],
            "written": written}


def _show(model: str, job, acc, by: str, ranked, left) -> None:
    out = console()
    whose = "" if acc else "; each machine computes with its own GPUs"
    out.print(f"[bold]{model}[/] ({job.params / 1e6:,.1f}M parameters), {job.tokens:,} "
              f"tokens in {job.steps:,} steps of {job.tokens_per_step:,}{whose}", soft_wrap=True)
    for a in _used(ranked):
        out.print(f"  {a.name} at {a.tokens_per_s:,.0f} tokens/s per {'vCPU' if a.per_vcpu else 'GPU'} "
                  f"on GPT-2 124M ({a.source})", soft_wrap=True, markup=False)
    out.print(_table(ranked, by))
    if left:
        out.print(f"not ranked: {_reasons(left)}; give --accelerator NAME or --tokens-per-s to "
                  "plan them", soft_wrap=True, markup=False)
    out.print("[dim]GPUs: each node's, one trainer rank each, summed inside the node before the ring "
              "across the nodes (a node outside the catalogs: the seed's RTX 4090 unless --accelerator); "
              "link: the baseline (never the burst), capped by the flows the job opens; "
              "step: comm=auto's method (plain DDP's step in brackets); exposed: hook + exposed "
              "communication over the step. burst-only: baseline under half the advertised rate; "
              "flow-capped: the tier's rate is more than the planned flows carry; measured: a declared "
              "cluster's link as its newest netcheck measured it (below tier: under its tier's rate).[/]")


def _accel_dict(acc) -> dict:
    return {"name": acc.name, "kind": acc.kind, "tokens_per_s": acc.tokens_per_s,
            "per_vcpu": acc.per_vcpu, "source": acc.source}


def _reasons(left) -> str:
    """The unranked types grouped by why, `reason: type, type`; past four types, counted."""
    by_reason: dict[str, list[str]] = {}
    for u in left:
        by_reason.setdefault(u.reason, []).append(u.machine.name)
    return "; ".join(f"{why}: {', '.join(names[:4])}{f' and {len(names) - 4} more' if len(names) > 4 else ''}"
                     for why, names in by_reason.items())


def _write(project, name: str, ranked) -> dict:
    """Add the best row that is a catalog machine to the cluster file; what was written."""
    best = next((p for p in ranked if p.candidate.measured is None
                 and p.candidate.provider in MACHINE_KEY), None)  # a provider whose tables name a machine
    if best is None:
        raise ConfigError("--write: no catalog machine among the rows (give a --catalog)")
    c = best.candidate
    like = next((k for k in project.clusters.values() if k.provider == c.provider), None)
    if project.path is None:
        like = None
    block = cluster_block(name, c.provider, c.machine.name, c.tier, c.nodes, c.machine.gpus, like)
    path = add_cluster(project, name, block)
    return {"cluster": name, "path": str(path), **best.to_dict()}


def _job(params: int, opts: dict):
    """The job from --tokens, or --steps x --batch (tokens per step, default llm.c's 524,288)."""
    tokens, steps, batch = opts["tokens"], opts["steps"], opts["batch"]
    if tokens is not None and steps is not None:
        raise ConfigError("give --tokens or --steps, not both")
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be 1 or more, not {steps}")
    per_step = parse_count(batch) if batch else DEFAULT_TOKENS_PER_STEP
    total = parse_count(tokens) if tokens else (steps * per_step if steps else 10**10)
    return Job(params, total, per_step)


def _table(ranked, by: str):
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=f"ranked by {by}")
    for column in ("#", "provider", "machine", "GPUs", "tier", "nodes", "link Gbit/s", "method",
                   "exposed", "step s (plain)", "hours", "$", "marks"):
        table.add_column(column, no_wrap=True, justify="left" if column in (
            "provider", "machine", "GPUs", "tier", "method", "marks") else "right")
    for i, p in enumerate(ranked, 1):
        c, link = p.candidate, p.link
        marks = [m for m, on in (("measured", c.measured is not None),
                                 ("burst-only", link.burst_only),
                                 ("below tier" if c.measured else "flow-capped",
                                  link.tier_unreachable)) if on]
        gbps = f"{link.gbps:g}" + (f" of {link.baseline_gbps:g}" if link.gbps < link.baseline_gbps else "")
        table.add_row(str(i), c.provider, c.machine.name, _gpus(p), c.tier, str(c.nodes), gbps, p.method,
                      f"{p.exposed_share:.0%}", f"{p.step_s:.2f} ({p.plain_step_s:.2f})",
                      f"{p.hours:,.1f}", f"{p.dollars:,.0f}" if p.dollars is not None else "?",
                      ", ".join(marks))
    return table


def _gpus(p) -> str:
    """What computes on each node: `4x T4`, `8 vCPU`."""
    if p.accel is None:
        return "?"
    return f"{p.per_node} vCPU" if p.accel.per_vcpu else f"{p.per_node}x {p.accel.name}"
