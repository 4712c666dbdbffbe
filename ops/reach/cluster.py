"""One cluster, resolved once per command and handed to every stage (docs/ARCHITECTURE.md, "Inside ops").

A command turns its CLUSTER argument into a `Cluster` once (`Cluster.resolve`, the one name
lookup outside the commands and the stacks' entry points): the project, the cluster's entry of the file,
its outputs once deployed, its state folder (its outputs file, its runs), its dataset, the
transports to its nodes, the command's node answers (ops/reach/asknode.py) and the command's log.
Ops take it in place of `(project, outputs, log)` and never look the cluster up by name again,
nor derive its files from its name (tests/unit/test_architecture.py holds both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fatpipe.infra.dataspec import cluster_data
from fatpipe.infra.runs import find_run, latest_run_id, load_outputs, mark_latest, outputs_file, runs_dir

from .asknode import NodeAnswers
from .transport import Transport, transport_for


def _quiet(_line: str) -> None:
    pass


@dataclass
class Cluster:
    """A command's cluster: `spec` is the project file's entry, `outputs` what its deploy wrote
    (None before a deploy), `answers` the node answers the command's calls brought."""

    project: object  # infra.project.Project
    spec: object | None = None  # the cluster's model (infra.clusters); None: known by its outputs alone
    outputs: object | None = None  # infra.outputs.Outputs
    log: Callable[[str], None] = _quiet
    answers: NodeAnswers = field(default_factory=NodeAnswers)

    @classmethod
    def resolve(cls, project, name: str | None = None, outputs=None, log: Callable[[str], None] = _quiet) -> Cluster:
        """The named cluster of `project` (the only one when no name is given); raises its ConfigError."""
        return cls(project, project.cluster(name), outputs, log)

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else self.outputs.name

    @property
    def state_dir(self) -> Path:
        return self.project.state_dir(self.name)

    @property
    def outputs_path(self) -> Path:
        """Where its deploy writes the outputs (`.fatpipe/<cluster>/outputs.json`)."""
        return outputs_file(self.project, self.name)

    @property
    def runs_dir(self) -> Path:
        return runs_dir(self.project, self.name)

    def load_outputs(self, path=None):
        """The outputs its deploy wrote, or those of the file `path` (infra.runs.load_outputs)."""
        return load_outputs(self.project, self.name, path)

    def find_run(self, run_id: str | None = None) -> tuple[str, Path]:
        """(id, folder) of its run `run_id`, the latest by default (infra.runs.find_run)."""
        return find_run(self.project, self.name, run_id)

    def latest_run_id(self) -> str | None:
        """The run its `runs/latest` names, or None."""
        return latest_run_id(self.project, self.name)

    def mark_latest(self, run_id: str | None) -> None:
        """Make `run_id` its latest run (None: no run is)."""
        mark_latest(self.project, self.name, run_id)

    @property
    def data(self):
        """The dataset the cluster gets (infra.dataspec.DataSpec), None without one."""
        return cluster_data(self.project.spec, self.name)

    def deployed(self, outputs) -> Cluster:
        """This cluster with `outputs`, its node answers the same."""
        return dataclasses.replace(self, outputs=outputs)

    def logging(self, log: Callable[[str], None]) -> Cluster:
        """This cluster logging to `log`, its node answers the same."""
        return dataclasses.replace(self, log=log)

    def transport(self, node, ssh_user: str = "", provider: str = "") -> Transport:
        """The transport to `node` (an outputs node or a rendezvous node plan), sharing the answers."""
        made = transport_for(node, self.state_dir, ssh_user, provider)
        made.answers = self.answers
        return made

    def transports(self) -> list[Transport]:
        """One transport per deployed node, in node order."""
        return [self.transport(node, self.outputs.ssh_user, self.outputs.provider) for node in self.outputs.nodes]
