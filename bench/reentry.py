"""How a command's cluster travels through ops: the rooms and modules a launch's rendezvous and a
data push's cluster pass through, and how often they come back to one they had left; and how
often each phase of a real `fatpipe up` crosses from cli into ops with the cluster.

A profile hook (sys.setprofile) sees every call of a real `fatpipe launch` and `fatpipe data push`
on a cluster of local nodes (this machine, loopback addresses): a call in ops that takes the
rendezvous (launch), or the cluster's outputs or the object carrying them (data push), as an
argument is one step of the object's travel. Nothing here reads imports, so a function-level
import hides nothing. Counted per ops room (ops/<room>/) and per module: the calls, the distinct
places, and the re-entries (a step into a place the object had left before). `up` (its
deployment reused, netcheck quick): per phase, the calls a cli module makes into ops with the
command's cluster, its outputs, the rendezvous or the run's nodes as an argument (`PhaseWalk`);
the decisions `up` makes between two phases are counted apart, as `before <phase>`.

    python bench/reentry.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

NODES = 2
CLUSTER = "demo"


def local_cluster(folder: Path) -> None:
    """A deployed sim cluster of local nodes, booted, with a script and a small [data] source."""
    (folder / "fatpipe.toml").write_text(f'[clusters.{CLUSTER}]\nprovider = "sim"\nnodes = {NODES}\n'
                                         '[data]\nsource = "corpus"\npath = "data/corpus"\n')
    (folder / "corpus").mkdir()
    (folder / "corpus" / "a.bin").write_bytes(b"a" * 4096)
    (folder / "train.py").write_text("print('hi')\n")
    nodes = []
    for i in range(NODES):
        ready = folder / f"ready-{i}.json"
        ready.write_text(json.dumps({"iface": "lo", "mtu": 65536, "namespaced": []}))
        nodes.append({"name": f"{CLUSTER}-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local",
                      "ready_file": str(ready)})
    state = folder / ".fatpipe" / CLUSTER
    state.mkdir(parents=True)
    (state / "outputs.json").write_text(json.dumps({
        "name": CLUSTER, "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24", "rdzv_port": 29400,
        "nodes": nodes}))


class Travel:
    """The ops calls that take an object `carries` recognises, in the order they were made."""

    def __init__(self, carries):
        self.carries, self.steps = carries, []
        self.ops = str(Path(__import__("fatpipe.ops").ops.__file__).parent) + os.sep

    def __call__(self, frame, event, _arg):
        if event != "call" or not frame.f_code.co_filename.startswith(self.ops):
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if names[:1] == ("self",) and self.carries(frame.f_locals.get("self")):
            return  # the object's own method or property: reading it, not travelling
        if any(self.carries(frame.f_locals.get(name)) for name in names):
            rel = code.co_filename[len(self.ops):]
            self.steps.append((rel.split(os.sep)[0], rel, code.co_name))

    def summary(self) -> dict:
        def walk(key: int) -> dict:
            seen, entries, last = set(), 0, None
            for step in self.steps:
                place = step[key]
                if place != last and place in seen:
                    entries += 1
                seen.add(place)
                last = place
            return {"places": len(seen), "re_entries": entries}

        return {"calls": len(self.steps), "rooms": walk(0), "modules": walk(1),
                "path": [f"{room}: {module.split(os.sep)[-1]}.{func}" for room, module, func in self.steps]}


class PhaseWalk:
    """Per `up` phase (cli/render.py `Phases.run` or `skip`), the cli -> ops calls that carry the run."""

    def __init__(self):
        import fatpipe.cli
        import fatpipe.ops

        self.cli = str(Path(fatpipe.cli.__file__).parent) + os.sep
        self.ops = str(Path(fatpipe.ops.__file__).parent) + os.sep
        self.render = self.cli + "render.py"
        self.phase, self.waiting, self.crossings = None, [], {}

    def __call__(self, frame, event, _arg):
        code = frame.f_code
        if event != "call":
            if event == "return" and code.co_filename == self.render and code.co_name in ("run", "skip"):
                self.phase = None
            return
        if code.co_filename == self.render and code.co_name in ("run", "skip") and "name" in frame.f_locals:
            self.phase = frame.f_locals["name"]
            if self.waiting:  # what `up` decided between two phases, before this one
                self.crossings[f"before {self.phase}"] = self.waiting
            self.crossings.setdefault(self.phase, [])
            self.waiting = []
            return
        caller = frame.f_back
        if not (code.co_filename.startswith(self.ops) and caller and caller.f_code.co_filename.startswith(self.cli)):
            return
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if names[:1] == ("self",) and carries_run(frame.f_locals.get("self")):
            return  # the object's own method or property: reading it
        if any(carries_run(frame.f_locals.get(name)) for name in names):
            step = f"{caller.f_code.co_filename[len(self.cli):]} -> {code.co_filename[len(self.ops):]}:{code.co_name}"
            (self.crossings.setdefault(self.phase, []) if self.phase else self.waiting).append(step)


def carries_run(value) -> bool:
    """The command's cluster, its outputs, the run's rendezvous or its nodes."""
    if isinstance(value, list | tuple) and value:
        value = value[0]
    return type(value).__name__ in ("Cluster", "ClusterOutputs", "Rendezvous", "NodeRun")


def walk_up(args: list[str]) -> dict[str, list[str]]:
    """`fatpipe up ARGS` under `PhaseWalk`: {phase: its crossings}."""
    from fatpipe.cli.main import cli

    walk = PhaseWalk()
    sys.setprofile(walk)
    try:
        result = CliRunner().invoke(cli, ["up", *args], catch_exceptions=False)
    finally:
        sys.setprofile(None)
    if result.exit_code != 0:
        raise SystemExit(f"fatpipe up {' '.join(args)} failed ({result.exit_code}):\n{result.output}")
    return walk.crossings


def is_rendezvous(value) -> bool:
    return type(value).__name__ == "Rendezvous"


def carries_outputs(value) -> bool:
    """The cluster's outputs, or what carries them (the command's Cluster)."""
    return "ClusterOutputs" in (type(value).__name__, type(getattr(value, "outputs", None)).__name__)


def traced(args: list[str], carries) -> dict:
    from fatpipe.cli.main import cli

    travel = Travel(carries)
    sys.setprofile(travel)
    try:
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
    finally:
        sys.setprofile(None)
    if result.exit_code != 0:
        raise SystemExit(f"fatpipe {' '.join(args)} failed ({result.exit_code}):\n{result.output}")
    return travel.summary()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the full trace as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fatpipe-reentry-") as folder:
        os.chdir(folder)
        os.environ.pop("FATPIPE_CONFIG", None)
        local_cluster(Path(folder))
        pushed = traced(["data", "push"], carries_outputs)  # before the launch: it checks the data
        found = {"launch: the rendezvous": traced(["launch", "--", "train.py"], is_rendezvous),
                 "data push: the cluster's outputs": pushed}
        phases = walk_up(["--netcheck", "quick", "--", "train.py"])
    if args.json:
        print(json.dumps({**found, "up: per phase": phases}, indent=2))
        return 0
    print(f"{'':36} {'calls':>5} {'rooms':>5} {'re-entries':>10} {'modules':>7} {'re-entries':>10}")
    for what, doc in found.items():
        print(f"{what:36} {doc['calls']:5} {doc['rooms']['places']:5} {doc['rooms']['re_entries']:10} "
              f"{doc['modules']['places']:7} {doc['modules']['re_entries']:10}")
    print(f"\n{'up: phase':18} {'cli -> ops calls with the run':>30}")
    for phase, steps in phases.items():
        print(f"{phase:18} {len(steps):30}   {'; '.join(steps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
