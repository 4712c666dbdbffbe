"""Apply or destroy a cluster's synthesized stack with terraform, tofu or cdktf; write its outputs."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fatpipe.infra.defaults import DEFAULT_ENGINE, ENGINES
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_json_atomic
from fatpipe.infra.outputs import ClusterOutputs, parse_outputs, read_outputs
from fatpipe.infra.runs import outputs_file as outputs_path

from .app import OUTDIR, synth
from .nodeplan import NodeChange, node_changes, review
from .providers import provider_for, provider_of
from .shield import capture, hold_signals, shield_cdk_runtime, stream

CDKTF_LOCAL = Path(".tools/node_modules/.bin/cdktf")
OVERRIDE_GLOB = "*_override.tf.json"  # Terraform merges these over the synthesized JSON
# Offline and non-interactive: no version-check call home, no prompts, no "run terraform X next".
QUIET_ENV = {"CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0", "CI": "1"}

Log = Callable[[str], None]
Approve = Callable[[list[NodeChange]], bool]
PLAN_FILE = "fatpipe.tfplan"  # the saved plan, in the stack folder; removed once applied or refused
DESTROYED = re.compile(r"(\S+): Destruction complete")  # terraform's, tofu's and cdktf's line per resource


@dataclass
class Teardown:
    """What a destroy did: the engine's resources, the leftovers swept after it, what it left alone."""

    cluster: str
    destroyed: list[str] = field(default_factory=list)  # resource addresses the engine destroyed
    swept: list[str] = field(default_factory=list)  # this project's leftovers removed after it
    kept: list[str] = field(default_factory=list)  # named like the cluster's nodes, another project's

    def summary(self) -> str:
        parts = [f"destroyed {len(self.destroyed)} resource(s)" if self.destroyed else "nothing was deployed"]
        if self.swept:
            parts.append("removed leftovers: " + ", ".join(self.swept))
        if self.kept:
            parts.append("left alone (another project's): " + ", ".join(self.kept))
        return "; ".join(parts)


def synth_stack(project, cluster) -> Path:
    """Synthesize the stack of `cluster` (the command's resolved spec), the CDK runtime shielded from
    Ctrl-C and never cut mid-call."""
    shield_cdk_runtime()
    with hold_signals():
        return synth(project, [cluster])[cluster.name]


def deploy_cluster(project, cluster, engine: str = DEFAULT_ENGINE, yes: bool = False,
                   confirm: Callable[[str], bool] | None = None,
                   log: Log | None = None, approve: Approve | None = None) -> ClusterOutputs:
    """Synthesize and apply the stack of `cluster` (the command's resolved spec), then write
    .fatpipe/<name>/outputs.json (bare shape).

    `approve(changes)` is asked when the plan would replace, destroy or stop existing nodes;
    without it, or on its no, nothing is applied (stacks/nodeplan.py)."""
    name = cluster.name
    log = log or _quiet
    provider = provider_for(cluster.provider)
    cluster = provider.preflight(cluster, project, log)
    project = project.with_cluster(cluster)
    if provider.paid and not yes:
        question = (f"Create {cluster.nodes} {cluster.provider} node(s) in {', '.join(cluster.node_regions)} for "
                    f"cluster {name}? They cost money until `fatpipe down {name}`.")
        if confirm is None or not confirm(question):
            raise FatpipeError(f"deploy of {name} cancelled; nothing was created (--yes skips the question)")
    runner = Runner(engine, project, name, log, cluster)
    runner.replace, runner.approve = _vanished(project, cluster, log), approve
    doc = runner.apply()
    outputs = parse_outputs(doc, name, label=f"{engine} outputs of {name}")
    write_json_atomic(outputs_path(project, name), outputs.model_dump(mode="json"))
    return outputs


def destroy_cluster(project, cluster, name: str | None = None, engine: str = DEFAULT_ENGINE,
                    log: Log | None = None) -> Teardown:
    """Destroy the stack of `cluster` (the command's resolved spec; None for one no longer declared,
    known by `name` and its last synth) and remove its outputs; says what went, and what was left alone."""
    log = log or _quiet
    name = cluster.name if cluster is not None else name
    result = Teardown(name)

    def record(line: str) -> None:
        found = DESTROYED.search(line)
        if found:
            result.destroyed.append(found.group(1))
        log(line)

    Runner(engine, project, name, record, cluster).destroy()
    provider = provider_of(cluster)
    result.swept = provider.sweep(project, name, log)
    result.kept = provider.left_alone(name)
    outputs_path(project, name).unlink(missing_ok=True)
    # The next deploy brings new nodes with new host keys, which accept-new would refuse.
    (project.state_dir(name) / "known_hosts").unlink(missing_ok=True)
    return result


def _vanished(project, cluster, log: Log) -> list[str]:
    """Addresses of nodes that terraform's state holds but that are gone (a restart clears a sim's
    namespaces, ends a vm's QEMU): a plain apply would see nothing to do, so they are replaced."""
    if not outputs_path(project, cluster.name).exists():
        return []
    try:
        outputs = read_outputs(outputs_path(project, cluster.name), cluster.name)
    except FatpipeError:
        return []  # unreadable outputs: the apply rewrites them
    gone = provider_for(cluster.provider).vanished_nodes(project, outputs)
    if gone:
        log(f"fatpipe: {', '.join(gone)}: gone from this machine though deployed; making them again")
    return [f"terraform_data.node-{name.rsplit('-', 1)[1]}" for name in gone]


class Runner:
    """One cluster's stack folder and the engine binary that works on it."""

    def __init__(self, engine: str, project, name: str, log: Log, cluster=None):
        if engine not in ENGINES:
            raise FatpipeError(f"unknown engine {engine!r}; allowed: {', '.join(ENGINES)}")
        self.engine, self.project, self.name, self.log = engine, project, name, log
        self.cluster = cluster  # the resolved spec; None: no longer declared, destroyed from its last synth
        self.replace: list[str] = []  # resource addresses the next apply replaces (gone nodes)
        self.approve: Approve | None = None  # asked before a node is replaced, destroyed or stopped
        self.binary = _find_binary(engine, project.root)
        # What plans and applies: the engine itself, or for cdktf the terraform it drives.
        self.tf_binary = self.binary if engine != "cdktf" else _find_binary("terraform", project.root)

    # --- the two operations ---

    def apply(self) -> dict:
        """Plan, stop for the user's yes where an existing node would be replaced, destroyed or
        stopped (stacks/nodeplan.py), then apply exactly that saved plan: nothing else slips in.
        cdktf's deploy cannot apply a saved plan, so with cdktf the plan and the apply run with
        terraform in the stack folder cdktf deploys from (the same JSON, state and backend)."""
        stack_dir = self._synth()
        self._place_overrides(stack_dir)
        plan_file = stack_dir / PLAN_FILE
        try:
            try:
                self._init(stack_dir)
                self._tf(stack_dir, "plan", "-input=false", f"-out={PLAN_FILE}",
                         *(f"-replace={address}" for address in self.replace))
                plan = json.loads(capture([self.tf_binary, f"-chdir={stack_dir}", "show", "-json", PLAN_FILE],
                                          self.project.root, _env()))
            except FatpipeError as e:
                raise FatpipeError(self._partial_message("plan", stack_dir, e)) from None
            review(node_changes(plan, self.cluster.node_name, tuple(self.replace)), self.name, self.approve)
            try:
                self._tf(stack_dir, "apply", "-input=false", PLAN_FILE)
            except FatpipeError as e:
                raise FatpipeError(self._partial_message("apply", stack_dir, e)) from None
        finally:
            plan_file.unlink(missing_ok=True)
        return json.loads(capture([self.tf_binary, f"-chdir={stack_dir}", "output", "-json"],
                                  self.project.root, _env()))

    def destroy(self) -> None:
        stack_dir = self._synth()
        if stack_dir is None:
            self.log(f"{self.name}: no stack was ever synthesized; nothing to destroy")
            return
        try:
            self._place_overrides(stack_dir)
            if self.engine == "cdktf":
                self._cdktf(stack_dir, "destroy", self.name, "--auto-approve")
            else:
                self._init(stack_dir)
                self._tf(stack_dir, "destroy", "-auto-approve", "-input=false")
        except FatpipeError as e:
            raise FatpipeError(self._partial_message("destroy", stack_dir, e)) from None

    # --- helpers ---

    def _init(self, stack_dir: Path) -> None:
        # -upgrade: the lock file must follow the pins of this synth and its override files
        # (cdktf pins exact versions, so nothing newer sneaks in).
        self._tf(stack_dir, "init", "-input=false", "-upgrade")

    def _place_overrides(self, stack_dir: Path) -> None:
        """Put the project's Terraform override files for this cluster beside its stack.

        `.fatpipe/<cluster>/*_override.tf.json` (another provider endpoint, a pinned version,
        a swapped AMI) survive every synth; the stack folder holds exactly these.
        """
        wanted = {p.name: p for p in sorted(self.project.state_dir(self.name).glob(OVERRIDE_GLOB))}
        for stale in stack_dir.glob(OVERRIDE_GLOB):
            if stale.name not in wanted:
                stale.unlink()
        for name, path in wanted.items():
            shutil.copyfile(path, stack_dir / name)
        if wanted:
            self.log(f"{self.name}: override files {', '.join(wanted)}")

    def _synth(self) -> Path | None:
        """A fresh synth while the cluster is declared; else the folder of its last synth."""
        if self.cluster is not None:
            return synth_stack(self.project, self.cluster)
        stack_dir = self.project.root / OUTDIR / "stacks" / self.name
        return stack_dir if (stack_dir / "cdk.tf.json").is_file() else None

    def _tf(self, stack_dir: Path, *args: str) -> str:
        return stream([self.tf_binary, f"-chdir={stack_dir}", *args, "-no-color"], self.project.root,
                      self.log, _env())

    def _cdktf(self, stack_dir: Path, command: str, *args: str) -> str:
        # --skip-synth: deploy exactly the JSON fatpipe synthesized. The CLI still insists on a
        # cdktf.json in its working folder; a project folder need not have one, so give it a
        # minimal one elsewhere (terraform itself runs in the stack folder either way).
        outdir = stack_dir.parent.parent
        argv = [self.binary, command, *args, "--skip-synth", "--output", str(outdir), "--no-color"]
        if (self.project.root / "cdktf.json").is_file():
            return stream(argv, self.project.root, self.log, _env())
        with tempfile.TemporaryDirectory(prefix="fatpipe-cdktf-") as tmp:
            Path(tmp, "cdktf.json").write_text(json.dumps({"language": "python", "app": "true"}))
            return stream(argv, Path(tmp), self.log, _env())

    def _partial_message(self, what: str, stack_dir: Path, error: FatpipeError) -> str:
        """The failure, and which resources exist now: nothing half-made goes unreported."""
        try:
            left = capture([self.tf_binary, f"-chdir={stack_dir}", "state", "list"], self.project.root,
                           _env()).split()
        except FatpipeError:
            left = ["(could not read the state)"]
        exists = ", ".join(left) if left else "none"
        return (f"{self.engine} {what} of {self.name} failed: {error}\n"
                f"resources that exist now: {exists}\n"
                f"fix the cause and run `fatpipe deploy {self.name}` again, "
                f"or `fatpipe down {self.name}` to remove them")


def _env() -> dict:
    return {**os.environ, **QUIET_ENV}


def _find_binary(engine: str, root: Path) -> str:
    if engine == "cdktf":
        source_checkout = Path(__file__).resolve().parent.parent
        for base in (root, source_checkout):
            if (base / CDKTF_LOCAL).is_file():
                return str(base / CDKTF_LOCAL)
    found = shutil.which(engine)
    if not found:
        hint = {"cdktf": "run `make cdktf-cli` or npm install -g cdktf-cli@0.21",
                "terraform": "install terraform >= 1.4 (>= 1.10 for an S3 backend with use_lockfile), "
                             "or pass --engine tofu",
                "tofu": "install OpenTofu, or pass --engine terraform"}[engine]
        raise FatpipeError(f"{engine} not found on PATH; {hint}")
    return found


def _quiet(_line: str) -> None:
    pass
