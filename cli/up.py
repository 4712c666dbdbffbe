"""`fatpipe up [CLUSTER]`: synth, wheels, deploy, wait, netcheck, data, rendezvous, launch, summary.

Re-running `up` skips what is done: a deployment whose outputs match the cluster file and whose
nodes all answer ready skips synth, wheels, deploy and wait; a netcheck that passed on this
deployment is reused. Training always runs anew. `--down-after` destroys the cluster once every
node has recorded its exit (success, failure) or the user asks for a stop (Ctrl-C at the terminal,
a termination under `--on-signal stop`), and says what it destroyed, or that the destroy failed; a
run still going (a node out of reach, a termination that let go of it) keeps the cluster up
(`downafter.py`). A Ctrl-C during that teardown asks before abandoning it, without a terminal it
goes on.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.defaults import NETCHECK_FILE, NETCHECK_PLOT
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runs import new_run
from fatpipe.ops.env.preflight import NOTHING_TO_PAY, wheel_preflight
from fatpipe.ops.net.check import NetcheckOptions
from fatpipe.ops.plan.report import write_report
from fatpipe.ops.rdzv.faultmode import declared_regions, refuse_live_across_regions
from fatpipe.ops.rdzv.noderun import node_runs
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.reach.deployment import ready_deployment, reusable_netcheck
from fatpipe.ops.run.detach import DETACHED, let_go
from fatpipe.ops.run.end import ended_note
from fatpipe.ops.run.guard import refuse_if_running
from fatpipe.ops.run.launch import Follow
from fatpipe.ops.run.summary import no_steps_hint, run_summary
from fatpipe.stacks.engine import synth_stack
from fatpipe.stacks.providers import provider_for

from .deploying import deploy_outputs
from .downafter import DownAfter
from .netstep import netcheck_step
from .newrun import open_run
from .options import console, pass_project, pass_request, resolve_train
from .ready import require_ready, wait_ready
from .render import Phases, note, readiness_table, summary_table
from .signals import changing
from .steps import stage_data, train_on_cluster


@dataclass
class UpFlags:
    """What `fatpipe up` was asked to do, as given on the command line."""

    engine: str
    yes: bool
    replace: bool  # go on when the plan replaces, destroys or stops existing nodes
    down_after: bool
    netcheck_mode: str  # full | quick | off
    no_gate: bool
    netcheck_timeout: float | None  # default: netcheck's estimate
    wait_timeout: float
    timeout_s: float | None  # of the training run
    unreachable_s: float  # a node out of reach this long ends the follow, not the run
    outputs_file: str | None
    verbose: bool


@pass_project
@pass_request
def up(project, request, cluster, **flags):
    """The body of `fatpipe up`; its options and help are declared in train_commands.py."""
    cluster = Cluster.resolve(project, cluster)  # the one lookup: every phase gets this object
    train = resolve_train(project, request.overrides)
    job = Up(cluster, request, UpFlags(**flags), console())
    with changing(project, cluster.name, "up", request.on_signal):
        code = job.run_to_the_end(train, list(request.script))
    sys.exit(code)


class Up(DownAfter):
    """One `fatpipe up`: its phases in order, and a report of what each did."""

    def __init__(self, cluster: Cluster, request, flags: UpFlags, out):
        self.cluster, self.request, self.flags, self.out = cluster, request, flags, out
        self.project, self.spec = cluster.project, cluster.spec
        self.phases = Phases(out)
        self.report: dict = {"cluster": cluster.name}

    def run(self, train, script: list[str]) -> int:
        # Before anything is paid for: the rendezvous refuses it again with measured regions.
        refuse_live_across_regions(train, train.fault_tolerance, "script" if script else "trainer",
                                   declared_regions(self.spec))
        outputs, outputs_path = self.deployment()
        self.cluster = cluster = self.cluster.deployed(outputs)
        name = cluster.name
        if going := refuse_if_running(cluster, force=self.request.force):
            note(self.out)(going)
        run_id, run_dir = new_run(self.project, name)
        self.report["run_id"], self.report["run_dir"] = run_id, run_dir
        self.out.print(f"run [bold]{run_id}[/] in {run_dir.relative_to(self.project.root)}")
        # What netcheck asked the nodes (the firewall; the sweep: their versions) serves the training.
        with cluster.answers.keeping():
            self.netcheck(outputs_path, run_dir)
            stage_data(cluster, self.request, self.phases, self.out)
            return self.train((run_id, run_dir), train, script)

    def deployment(self):
        """The cluster's outputs and their file: reused when deployed as declared and ready, else made."""
        spec, flags, phases = self.spec, self.flags, self.phases
        path = Path(flags.outputs_file) if flags.outputs_file else self.cluster.outputs_path
        outputs, why = ready_deployment(self.cluster, path)
        if outputs is not None:
            for phase in ("synth", "wheels", "deploy", "wait"):
                phases.skip(phase, "deployed, outputs match the cluster file, every node ready")
            return outputs, path
        if path.exists():
            self.out.print(f"[dim]{why}: deploying[/]")
        stack_dir = phases.run("synth", f"the {spec.provider} stack of {spec.name}",
                               lambda: synth_stack(self.project, spec))
        phases.get("synth").note = str(stack_dir.relative_to(self.project.root))
        phases.get("wheels").note = phases.run("wheels", "a torch wheel for the nodes' Python, before anything "
                                               "is paid for", lambda: self.wheels(spec)) or NOTHING_TO_PAY
        outputs = phases.run("deploy", f"{spec.nodes} node(s) with {flags.engine}", lambda: deploy_outputs(
            self.cluster, flags.engine, flags.yes, flags.verbose, flags.replace))
        phases.get("deploy").note = f"{len(outputs.nodes)} node(s)"

        def wait():
            states = wait_ready(self.cluster.deployed(outputs), flags.wait_timeout, self.out)
            self.out.print(readiness_table(states, f"{spec.name}: nodes"))
            require_ready(states, flags.wait_timeout)
            return states

        states = phases.run("wait", "every node reachable, booted, tuned", wait, spinner=False)
        phases.get("wait").note = f"{len(states)}/{len(states)} ready"
        return outputs, self.cluster.outputs_path

    def wheels(self, spec) -> str | None:
        """The wheel preflight's line where the nodes are paid for; None where nothing is."""
        provider = provider_for(spec.provider)
        return wheel_preflight(self.cluster, provider.image_python(spec)) if provider.paid else None

    def netcheck(self, outputs_path: Path, run_dir: Path) -> None:
        mode, phases, outputs = self.flags.netcheck_mode, self.phases, self.cluster.outputs
        if mode == "off":
            phases.skip("netcheck", "--netcheck off")
            return
        earlier = reusable_netcheck(self.cluster, outputs_path.stat().st_mtime)
        if earlier is not None:
            for name in (NETCHECK_FILE, NETCHECK_PLOT):
                if (earlier.parent / name).exists():
                    shutil.copy2(earlier.parent / name, run_dir / name)
            phases.skip("netcheck", f"passed on this deployment in run {earlier.parent.name}")
            return
        options = NetcheckOptions(enforce=not self.flags.no_gate, quick=mode == "quick",
                                  timeout_s=self.flags.netcheck_timeout)
        remote_python = self.request.run_options.get("remote_python")
        doc = phases.run("netcheck", f"{mode} link check against {outputs.tier_gbps:g} Gbit/s",
                         lambda: netcheck_step(self.cluster, options, self.out, run_dir=run_dir,
                                              remote_python=remote_python),
                         spinner=False)
        passed = doc.get("gate", {}).get("passed")
        phases.get("netcheck").note = f"busbw {doc.get('busbw_gbps', 0):.2f} Gbit/s, " + (
            "passed" if passed else "below the tier (--no-gate)")

    def train(self, run: tuple[str, Path], train, script: list[str]) -> int:
        phases, run_dir, cluster, outputs = self.phases, run[1], self.cluster, self.cluster.outputs
        rdzv, _ = phases.run("rendezvous", f"c10d at {outputs.rdzv_endpoint}", lambda: open_run(
            cluster, self.request, train, script, run=run))
        phases.get("rendezvous").note = f"{rdzv.nnodes} x {rdzv.nproc_per_node} process(es)"
        what = " ".join(script) if script else f"built-in trainer, preset {train.preset}, {train.steps} steps"
        self.launched = node_runs(rdzv, cluster)
        result = self.result = phases.run("launch", what, lambda: train_on_cluster(
            cluster, self.launched, run_dir, self.out,
            Follow(self.flags.timeout_s, self.flags.unreachable_s, signal_detaches=True), self.flags.verbose),
            spinner=False)
        self.report["exit_codes"] = result.exit_codes
        launch = phases.get("launch")
        launch.note = ended_note(result)
        if not result.ok:
            launch.state = "failed"

        def summary():
            doc = run_summary(run_dir, outputs.tier_gbps)
            doc["left"] = result.left  # live: the nodes the run went on without, and when
            hint = no_steps_hint(script, result.ok, doc)  # a script that does not use the API
            self.out.print(hint or summary_table(doc), style="dim" if hint else None, markup=False)
            if doc["recorded_only"] and not hint:
                note(self.out)(f"the run ended before its summary: over the {doc['steps']} step(s) it recorded")
            return doc

        if result.unknown and not result.failure:  # still going on its nodes: nothing to sum up yet
            phases.skip("summary", "the run goes on on its nodes")
            return DETACHED if let_go(result.unknown) else result.exit_code
        self.report["summary"] = phases.run("summary", "what the run achieved", summary, spinner=False)
        note(self.out)(f"logs: fatpipe logs {outputs.name} --run {rdzv.run_id}")
        self.draw_report(run_dir, quiet=not result.ok)
        return result.exit_code

    def draw_report(self, run_dir: Path, quiet: bool = False) -> None:
        """The run's page (`fatpipe report`); a run too short to draw says so unless `quiet` (failed)."""
        try:
            page = write_report(run_dir)
        except FatpipeError as e:
            if not quiet:
                note(self.out)(f"no report: {e}")
            return
        self.report["report"] = str(page)
        note(self.out)(f"report: {page}")
