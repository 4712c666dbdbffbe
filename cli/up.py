"""`fatpipe up [CLUSTER]`: synth, deploy, wait, netcheck, rendezvous, launch, then a summary.

Re-running `up` skips what is done: a deployment whose outputs match the cluster file and whose
nodes all answer ready skips synth, deploy and wait; a netcheck that passed on this deployment
is reused. Training always runs anew. `--down-after` destroys the cluster at the end, also after
a failure (and says so when the destroy itself fails).
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from .deploy import engine_option, yes_option
from .options import cluster_argument, console, pass_project
from .runflags import (
    ScriptCommand,
    new_rendezvous,
    overrides,
    resolve_train,
    run_options,
    script_args,
    train_overrides,
)

PHASES = ("synth", "deploy", "wait", "netcheck", "rendezvous", "launch", "summary")


@dataclass
class Phase:
    name: str
    state: str = "not run"  # done | skipped | failed | not run
    seconds: float = 0.0
    note: str = ""


@dataclass
class Phases:
    """Runs the phases in order, shows which one is going, and keeps each one's time and outcome."""

    out: object
    phases: list[Phase] = field(default_factory=lambda: [Phase(name) for name in PHASES])

    def get(self, name: str) -> Phase:
        for phase in self.phases:
            if phase.name == name:
                return phase
        phase = Phase(name)
        self.phases.append(phase)
        return phase

    def header(self, name: str, what: str) -> None:
        step = f"[{PHASES.index(name) + 1}/{len(PHASES)}] " if name in PHASES else ""
        self.out.rule(f"[bold]{step}{name}[/]: {what}", align="left")

    def run(self, name: str, what: str, fn, spinner: bool = True):
        phase = self.get(name)
        self.header(name, what)
        started = time.monotonic()
        try:
            if spinner:
                with self.out.status(f"{name}: {what}"):
                    value = fn()
            else:
                value = fn()
        except BaseException as e:
            phase.state, phase.note = "failed", str(e).splitlines()[0] if str(e) else type(e).__name__
            raise
        finally:
            phase.seconds = time.monotonic() - started
        if phase.state == "not run":
            phase.state = "done"
        return value

    def skip(self, name: str, why: str) -> None:
        phase = self.get(name)
        phase.state, phase.note = "skipped", why
        self.out.print(f"[dim][skip] {name}: {why}[/]")

    def table(self):
        from rich.table import Table

        table = Table(title="time per phase", title_justify="left")
        table.add_column("phase")
        table.add_column("state")
        table.add_column("seconds", justify="right")
        table.add_column("note")
        style = {"done": "green", "skipped": "dim", "failed": "red", "not run": "dim"}
        for p in self.phases:
            table.add_row(p.name, f"[{style[p.state]}]{p.state}[/]", f"{p.seconds:.1f}", p.note)
        table.add_row("total", "", f"{sum(p.seconds for p in self.phases):.1f}", "")
        return table


# ---- what can be skipped ----------------------------------------------------------------


def deployment_matches(outputs, spec) -> str | None:
    """Why the existing outputs do not describe the cluster file's cluster, or None if they do."""
    checks = [
        ("provider", outputs.provider, spec.provider),
        ("nodes", len(outputs.nodes), spec.nodes),
        ("tier_gbps", outputs.tier_gbps, spec.tier_gbps),
        ("rdzv_port", outputs.rdzv_port, spec.rdzv_port),
        ("private_cidr", outputs.private_cidr, spec.private_cidr),
    ]
    if spec.provider == "sim" and spec.isolation != "auto":
        checks.append(("isolation", (outputs.model_extra or {}).get("isolation"), spec.isolation))
    for key, have, want in checks:
        if have != want:
            return f"{key} is {have} in the outputs but {want} in the cluster file"
    return None


def reusable_netcheck(project, name: str, outputs_mtime: float) -> Path | None:
    """The newest netcheck.json that passed on the current deployment (written after its outputs)."""
    import json

    from fatpipe.infra.runs import runs_dir

    base = runs_dir(project, name)
    for path in sorted(base.glob("*/netcheck.json"), key=lambda p: p.parent.name, reverse=True):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        passed = doc.get("gate", {}).get("passed")
        if passed and path.stat().st_mtime > outputs_mtime:
            return path
    return None


# ---- the summary --------------------------------------------------------------------------


def summarize(run_dir: Path, tier_gbps: float) -> dict:
    """The numbers the summary shows, from the run's summary.json and netcheck.json."""
    import json

    def load(name: str) -> dict:
        path = run_dir / name
        try:
            return json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            return {}

    train, net = load("summary.json"), load("netcheck.json")
    doc = {
        "tier_gbps": tier_gbps,
        "final_loss": train.get("final_loss"),
        "steps": train.get("steps"),
        "tokens_per_s": train.get("tokens_per_s"),
        "step_s_p50": train.get("step_s_p50"),
        "step_s_p95": train.get("step_s_p95"),
        "sync_s_p50": train.get("sync_s_p50"),
        "sync_s_p95": train.get("sync_s_p95"),
        "train_busbw_gbps": train.get("busbw_gbps"),
        "netcheck_busbw_gbps": net.get("busbw_gbps"),
        "netcheck_passed": net.get("gate", {}).get("passed") if net else None,
        "comm": train.get("comm"),
        "world_size": train.get("world_size"),
        "restarts": train.get("restarts"),
    }
    return doc


def summary_table(doc: dict):
    from rich.table import Table

    def num(value, fmt: str, unit: str = "") -> str:
        return "-" if value is None else format(value, fmt) + unit

    def ms(value) -> str:
        return num(None if value is None else value * 1e3, ".1f", " ms")

    def bw(value) -> str:
        if value is None:
            return "-"
        return f"{value:.2f} Gbit/s ({100 * value / doc['tier_gbps']:.0f}% of the {doc['tier_gbps']:g} Gbit/s tier)"

    table = Table(title="summary", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    rows = [
        ("final loss", num(doc["final_loss"], ".4f")),
        ("steps", num(doc["steps"], "d")),
        ("tokens/s", num(doc["tokens_per_s"], ",.0f")),
        ("step time p50 / p95", f"{ms(doc['step_s_p50'])} / {ms(doc['step_s_p95'])}"),
        ("sync latency p50 / p95", f"{ms(doc['sync_s_p50'])} / {ms(doc['sync_s_p95'])}"),
        ("busbw in training", bw(doc["train_busbw_gbps"])),
        ("busbw in netcheck", bw(doc["netcheck_busbw_gbps"])),
        ("comm hook", str(doc["comm"] or "-")),
        ("world size / restarts", f"{doc['world_size'] or '-'} / {doc['restarts'] if doc['restarts'] is not None else '-'}"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


# ---- the command --------------------------------------------------------------------------


@click.command(cls=ScriptCommand)
@cluster_argument
@engine_option
@yes_option
@click.option("--down-after", is_flag=True, help="Destroy the cluster at the end, also after a failure.")
@click.option("--netcheck", "netcheck_mode", type=click.Choice(["full", "quick", "off"]), default="full",
              show_default=True, help="The link check before training: full sweep, a quick one, or none.")
@click.option("--no-gate", is_flag=True, help="Train even when netcheck finds the links below the tier.")
@click.option("--wait-timeout", type=click.FloatRange(1), default=600, show_default=True,
              help="Seconds to wait for the nodes to become ready.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=None,
              help="Stop the training run after this many seconds.")
@train_overrides
@run_options
@click.option("-v", "--verbose", is_flag=True, help="Show the deploy engine's full output.")
@pass_project
def up(project, cluster, engine, yes, down_after, netcheck_mode, no_gate, wait_timeout, timeout_s,
       outputs_file, nproc_per_node, max_restarts, join_timeout, remote_python, verbose):
    """Stand the cluster up, prove its links, train across it and summarize, in one command.

    Everything after `--` is your torchrun script and its arguments; without it the built-in
    trainer runs with [train] and the overrides given here.
    """
    from fatpipe.infra.errors import FatpipeError

    spec = project.cluster(cluster)
    train = resolve_train(project, overrides())
    script = script_args()
    out = console()
    phases = Phases(out)
    report: dict = {"cluster": spec.name}
    code = 1
    try:
        code = _up(project, spec, phases, report, out, train=train, script=script, engine=engine,
                   yes=yes, netcheck_mode=netcheck_mode, no_gate=no_gate, wait_timeout=wait_timeout,
                   timeout_s=timeout_s, outputs_file=outputs_file, verbose=verbose,
                   rdzv_options=dict(nproc_per_node=nproc_per_node, max_restarts=max_restarts,
                                     join_timeout_s=join_timeout, remote_python=remote_python))
    except KeyboardInterrupt:
        out.print("[yellow]interrupted[/]")
        code = 130
    except FatpipeError as e:
        out.print(f"[red]error[/]: {e}", markup=True, highlight=False)
        code = e.exit_code
    finally:
        if down_after:
            code = _down(project, spec.name, engine, phases, out, code)
        _finish(report, phases, out, code)
    sys.exit(code)


def _up(project, spec, phases: Phases, report: dict, out, *, train, script, engine, yes,
        netcheck_mode, no_gate, wait_timeout, timeout_s, outputs_file, verbose, rdzv_options) -> int:
    from fatpipe.infra.launch import refuse_if_running
    from fatpipe.infra.runs import new_run
    from fatpipe.infra.runs import outputs_file as default_outputs

    from .launch import note, run_training
    from .wait import readiness_table, require_ready, wait_ready

    name = spec.name
    outputs_path = Path(outputs_file) if outputs_file else default_outputs(project, name)
    outputs = _existing_deployment(project, spec, outputs_path, out)
    if outputs is not None:
        for phase in ("synth", "deploy", "wait"):
            phases.skip(phase, "deployed, outputs match the cluster file, every node ready")
    else:
        from .deploy import deploy_outputs

        def synth():
            from fatpipe.stacks.app import synth as synth_stacks

            return synth_stacks(project, [name])[name]

        stack_dir = phases.run("synth", f"the {spec.provider} stack of {name}", synth)
        phases.get("synth").note = str(stack_dir.relative_to(project.root))

        outputs = phases.run("deploy", f"{spec.nodes} node(s) with {engine}",
                             lambda: deploy_outputs(project, name, engine, yes, verbose))
        phases.get("deploy").note = f"{len(outputs.nodes)} node(s)"
        outputs_path = default_outputs(project, name)
        def wait():
            states = wait_ready(project, outputs, wait_timeout, out)
            out.print(readiness_table(states, f"{name}: nodes"))
            require_ready(states, wait_timeout)
            return states

        states = phases.run("wait", "every node reachable, booted, tuned", wait, spinner=False)
        phases.get("wait").note = f"{len(states)}/{len(states)} ready"

    refuse_if_running(project, name)
    run_id, run_dir = new_run(project, name)
    report["run_id"], report["run_dir"] = run_id, run_dir
    out.print(f"run [bold]{run_id}[/] in {run_dir.relative_to(project.root)}")
    _netcheck(project, outputs, outputs_path, run_dir, phases, out, netcheck_mode, no_gate,
              rdzv_options.get("remote_python"))

    rdzv, _ = phases.run("rendezvous", f"c10d at {outputs.rdzv_endpoint}", lambda: new_rendezvous(
        project, outputs, train, script, run=(run_id, run_dir), **rdzv_options))
    phases.get("rendezvous").note = f"{rdzv.nnodes} x {rdzv.nproc_per_node} process(es)"
    what = " ".join(script) if script else f"built-in trainer, preset {train.preset}, {train.steps} steps"
    result = phases.run("launch", what, lambda: run_training(project, outputs, rdzv, run_dir, out,
                                                              timeout_s=timeout_s), spinner=False)
    report["exit_codes"] = result.exit_codes
    launch_phase = phases.get("launch")
    if not result.ok:
        launch_phase.state = "failed"
        launch_phase.note = "interrupted" if result.interrupted else "timed out" if result.timed_out else (
            f"worst exit {result.exit_code}")
    else:
        launch_phase.note = f"all {len(result.exit_codes)} node(s) exit 0"

    def summary():
        doc = summarize(run_dir, outputs.tier_gbps)
        out.print(summary_table(doc))
        return doc

    report["summary"] = phases.run("summary", "what the run achieved", summary, spinner=False)
    note(out)(f"logs: fatpipe logs {name} --run {run_id}")
    return result.exit_code


def _existing_deployment(project, spec, outputs_path: Path, out):
    """The current outputs when the cluster is deployed as declared and every node is ready."""
    from fatpipe.infra.errors import FatpipeError
    from fatpipe.infra.outputs import read_outputs
    from fatpipe.infra.wait import wait_for_nodes

    if not outputs_path.exists():
        return None
    try:
        outputs = read_outputs(outputs_path, spec.name)
    except FatpipeError as e:
        out.print(f"[dim]existing outputs unusable ({e}): deploying[/]")
        return None
    mismatch = deployment_matches(outputs, spec)
    if mismatch:
        out.print(f"[dim]the deployment differs from the cluster file ({mismatch}): deploying[/]")
        return None
    states = wait_for_nodes(project, outputs, timeout_s=5, interval_s=1)
    late = [s for s in states if not s.ready]
    if late:
        out.print(f"[dim]{late[0].name} is not ready ({late[0].reason}): deploying[/]")
        return None
    return outputs


def _netcheck(project, outputs, outputs_path: Path, run_dir: Path, phases: Phases, out,
              mode: str, no_gate: bool, remote_python: str | None) -> None:
    from .launch import note

    if mode == "off":
        phases.skip("netcheck", "--netcheck off")
        return
    from fatpipe.infra.netcheck import NetcheckOptions, run_netcheck

    earlier = reusable_netcheck(project, outputs.name, outputs_path.stat().st_mtime)
    if earlier is not None:
        for name in ("netcheck.json", "netcheck.png"):
            if (earlier.parent / name).exists():
                shutil.copy2(earlier.parent / name, run_dir / name)
        phases.skip("netcheck", f"passed on this deployment in run {earlier.parent.name}")
        return
    options = NetcheckOptions(enforce=not no_gate, quick=mode == "quick")
    doc = phases.run("netcheck", f"{mode} link check against {outputs.tier_gbps:g} Gbit/s",
                     lambda: run_netcheck(project, outputs.name, run_dir=run_dir, options=options,
                                          outputs=outputs, log=note(out), console=out,
                                          remote_python=remote_python),
                     spinner=False)
    passed = doc.get("gate", {}).get("passed")
    phases.get("netcheck").note = f"busbw {doc.get('busbw_gbps', 0):.2f} Gbit/s, " + (
        "passed" if passed else "below the tier (--no-gate)")


def _down(project, name: str, engine: str, phases: Phases, out, code: int) -> int:
    """Destroy the cluster; a failed destroy is reported and makes the exit status nonzero."""
    from fatpipe.stacks.engine import destroy_cluster

    try:
        swept = phases.run("down", f"destroy {name} (--down-after)",
                           lambda: destroy_cluster(project, name, engine=engine))
    except Exception as e:  # noqa: BLE001 - whatever broke, the user must hear the cluster may be up
        out.print(f"[red]destroy of {name} failed[/]: {e}\nresources may be left: run `fatpipe down {name}`",
                  highlight=False)
        return code or 1
    phases.get("down").note = ("swept " + ", ".join(swept)) if swept else "destroyed"
    return code


def _finish(report: dict, phases: Phases, out, code: int) -> None:
    from fatpipe.infra.files import write_json_atomic

    out.print(phases.table())
    verdict = "[green]up finished[/]" if code == 0 else f"[red]up failed[/] (exit {code})"
    out.print(verdict)
    run_dir = report.get("run_dir")
    if run_dir is not None and Path(run_dir).exists():
        doc = {**report, "run_dir": str(run_dir), "exit_code": code,
               "phases": [asdict(p) for p in phases.phases]}
        write_json_atomic(Path(run_dir) / "up.json", doc)
