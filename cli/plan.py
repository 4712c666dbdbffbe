"""`fatpipe plan`: rank provider x machine type x tier x node count for a training job."""

from __future__ import annotations

import json
import re

import click

from fatpipe.infra.errors import ConfigError

from .options import console, pass_project

_ACCELERATORS = ("rtx4090", "h100", "cpu")  # infra.jobmodel.ACCELERATORS, without importing it


def parse_nodes(text: str) -> range:
    """`8` or `2-8` (inclusive), at least 2 nodes."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m:
        raise ConfigError(f"--nodes: {text!r} is not a count such as 8 or a range such as 2-8")
    low, high = int(m.group(1)), int(m.group(2) or m.group(1))
    if low < 2 or high < low or high > 256:
        raise ConfigError(f"--nodes: {text!r} must be 2 or more nodes, low-high, at most 256")
    return range(low, high + 1)


@click.command()
@click.option("--model", default="124m", show_default=True,
              help="A trainer preset (tiny, small, 124m) or a parameter count (124M, 1.5B).")
@click.option("--tokens", help="Tokens to train on (10B, 2.5B, 350000000). Default: --steps x --batch, else 10B.")
@click.option("--steps", type=int, default=None, help="Optimizer steps (with --batch).")
@click.option("--batch", help="Tokens per optimizer step, all nodes together. Default 524288.")
@click.option("--accelerator", "accel", type=click.Choice(_ACCELERATORS), default="rtx4090",
              show_default=True, help="What computes on each node (sourced tokens/s for GPT-2 124M).")
@click.option("--tokens-per-s", type=float, help="Your own tokens/s per GPU (per vCPU with cpu) on GPT-2 124M.")
@click.option("--catalog", "providers", multiple=True, type=click.Choice(["aws", "digitalocean"]),
              help="Provider catalogs to rank (repeatable; default: all, none with --link).")
@click.option("--tier", "tiers", multiple=True, type=click.Choice(["1g", "10g", "25g"]),
              help="Tiers to consider (repeatable; default: all).")
@click.option("--link", "links", multiple=True, type=float,
              help="Also plan nodes outside the catalogs with this link in Gbit/s (repeatable).")
@click.option("--span", type=click.Choice(["region", "regions", "internet"]), default="region",
              show_default=True, help="Where the nodes are: one region, several, or reached over the internet "
              "(AWS caps egress out of a region).")
@click.option("--nodes", default="2-8", show_default=True, help="Node count or range, e.g. 8 or 2-8.")
@click.option("--by", type=click.Choice(["time", "cost"]), default="time", show_default=True)
@click.option("--top", type=int, default=3, show_default=True, help="Rows shown, best first.")
@click.option("--auto-periodic", is_flag=True, default=None, help="Let comm=auto take DiLoCo/local SGD, as [train] auto_periodic.")
@click.option("--json", "as_json", is_flag=True, help="Print the ranking as JSON.")
@click.option("--write", "write_name", metavar="NAME",
              help="Add the best catalog row to fatpipe.toml as cluster NAME (whole or not at all).")
@pass_project(clusters_optional=True)
def plan(project, **opts):
    """Rank machine types, tiers and node counts by predicted step time or cost.

    Compute comes from the accelerator's published throughput, communication from a ring
    all-reduce over each type's baseline bandwidth (capped per flow), and the method from
    comm=auto's own model. Nothing is deployed.
    """
    from fatpipe.infra.jobmodel import accelerator
    from fatpipe.ops.plan import plan as planner
    from fatpipe.ops.plan.planmeasured import measured_candidates

    count = parse_nodes(opts["nodes"])
    if opts["top"] < 1:
        raise ConfigError(f"--top must be 1 or more, not {opts['top']}")
    traffic = planner.model_traffic(opts["model"])
    job = _job(traffic.params, opts)
    acc = accelerator(opts["accel"], opts["tokens_per_s"])
    # --link alone plans those links; the catalogs join when a --catalog names them.
    providers = opts["providers"] or (() if opts["links"] else planner.PROVIDERS)
    cands = planner.candidates(acc, count, providers,
                               opts["tiers"] or ("1g", "10g", "25g"), project.root, opts["span"])
    cands += planner.link_candidates(list(opts["links"]), count) + measured_candidates(project)
    if not cands:
        need = "a GPU" if acc.gpus else "no GPU"
        raise ConfigError(f"no machine type with {need} reaches the tiers asked; try another "
                          "--catalog, --tier or --accelerator, or give --link")
    by = opts["by"]
    ranked = planner.plan(job, acc, traffic, cands, by, bool(opts["auto_periodic"]))
    written = _write(project, opts["write_name"], ranked) if opts["write_name"] else None
    if written and not opts["as_json"]:
        console(stderr=True).print(f"wrote \\[clusters.{written['cluster']}] to {written['path']}: "
                                   f"{written['provider']} {written['machine']} x "
                                   f"{written['nodes']}, tier {written['tier']}")
    ranked = ranked[: opts["top"]]
    if opts["as_json"]:
        head = {"job": {"model": opts["model"], "params": job.params, "tokens": job.tokens,
                        "tokens_per_step": job.tokens_per_step, "steps": job.steps},
                "accelerator": {"name": acc.name, "tokens_per_s": acc.tokens_per_s,
                                "per_vcpu": acc.per_vcpu, "source": acc.source}, "by": by}
        doc = {**head, "plans": [p.to_dict() for p in ranked], "written": written}
        click.echo(json.dumps(doc, indent=1))
        return
    out = console()
    out.print(f"[bold]{opts['model']}[/] ({job.params / 1e6:,.1f}M parameters), {job.tokens:,} "
              f"tokens in {job.steps:,} steps of {job.tokens_per_step:,}; {acc.name} at "
              f"{acc.tokens_per_s:,.0f} tokens/s per {'vCPU' if acc.per_vcpu else 'GPU'} on GPT-2 "
              f"124M ({acc.source})", soft_wrap=True)
    out.print(_table(ranked, by))
    out.print("[dim]link: the baseline (never the burst), capped by the flows the job opens; "
              "step: comm=auto's method (plain DDP's step in brackets); exposed: hook + exposed "
              "communication over the step. burst-only: baseline under half the advertised rate; "
              "flow-capped: the tier's rate is more than the planned flows carry; measured: a declared "
              "cluster's link as its newest netcheck measured it (below tier: under its tier's rate).[/]")


def _write(project, name: str, ranked) -> dict:
    """Add the best row that is a catalog machine to the cluster file; what was written."""
    from fatpipe.infra.planwrite import add_cluster, cluster_block

    best = next((p for p in ranked if p.candidate.measured is None
                 and p.candidate.provider in ("aws", "digitalocean")), None)
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
    from fatpipe.infra.jobmodel import DEFAULT_TOKENS_PER_STEP, Job
    from fatpipe.ops.plan.plan import parse_count

    tokens, steps, batch = opts["tokens"], opts["steps"], opts["batch"]
    if tokens is not None and steps is not None:
        raise ConfigError("give --tokens or --steps, not both")
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be 1 or more, not {steps}")
    per_step = parse_count(batch) if batch else DEFAULT_TOKENS_PER_STEP
    total = parse_count(tokens) if tokens else (steps * per_step if steps else 10**10)
    return Job(params, total, per_step)


def _table(ranked, by: str):
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=f"ranked by {by}")
    for column in ("#", "provider", "machine", "tier", "nodes", "link Gbit/s", "method",
                   "exposed", "step s (plain)", "hours", "$", "marks"):
        table.add_column(column, no_wrap=True, justify="left" if column in (
            "provider", "machine", "tier", "method", "marks") else "right")
    for i, p in enumerate(ranked, 1):
        c, link = p.candidate, p.link
        marks = [m for m, on in (("measured", c.measured is not None),
                                 ("burst-only", link.burst_only),
                                 ("below tier" if c.measured else "flow-capped",
                                  link.tier_unreachable)) if on]
        gbps = f"{link.gbps:g}" + (f" of {link.baseline_gbps:g}" if link.gbps < link.baseline_gbps else "")
        table.add_row(str(i), c.provider, c.machine.name, c.tier, str(c.nodes), gbps, p.method,
                      f"{p.exposed_share:.0%}", f"{p.step_s:.2f} ({p.plain_step_s:.2f})",
                      f"{p.hours:,.1f}", f"{p.dollars:,.0f}" if p.dollars is not None else "?",
                      ", ".join(marks))
    return table
