"""The layers of docs/ARCHITECTURE.md hold: imports run one way, modules and functions stay small,
and what two layers must both define is defined the same way."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("infra", "stacks", "ops", "cli", "trainer", "node")
# Which fatpipe packages each layer may import (its own included).
ALLOWED = {
    "infra": {"infra"},
    "stacks": {"infra", "stacks"},
    "ops": {"infra", "ops", "trainer", "node"},  # ops ships the trainer package and runs its benchmark
    "cli": {"infra", "stacks", "ops", "cli", "trainer", "node"},
    "trainer": {"trainer", "node"},  # runs on a node with torch alone (the node's environment: node.env)
    "node": {"node"},  # the programs sent to a node: the standard library alone (test_node_boundary.py)
}
# Inside trainer/ (docs/ARCHITECTURE.md, "Inside the trainer"): which of its folders each may
# import; "" is trainer/ itself, the shared base. The built-in trainer's own modules (BUILT_IN)
# sit at the top, on the API and the comm layer.
TRAINER_FOLDERS = {
    "": {""},
    "comm": {"", "comm"},
    "api": {"", "comm", "api", "live"},  # live: a script under fault_tolerance = "live"
    "net": {"", "comm", "net"},
    "staging": {"staging"},  # the standard library alone: the operator runs the manifest too
    "live": {"", "live"},  # torchft's Manager and Lighthouse for fault_tolerance = "live"
}
BUILT_IN = {"__main__", "train", "livetrain"}
# Inside ops/ (docs/ARCHITECTURE.md, "Inside ops"): its rooms, in the order a command goes
# through them. A room may import the rooms before it and itself, never one after it.
OPS_ROOMS = ("reach", "rdzv", "env", "data", "run", "net", "plan")
# Imports that still go against the rooms' order: each is work left, named here so no new one
# slips in.
OPS_UPWARD: set[tuple[str, str]] = set()  # none left: the data chain runs without the launch path
# cli modules every command may use; a command module never imports another command module.
CLI_SHARED = {"__init__", "__main__", "main", "declare", "options", "render", "steps", "deploying", "ready", "netstep", "newrun", "results", "downafter", "signals", "ending"}
MAX_MODULE_LINES = 300
MAX_PARAMETERS = 8


def modules() -> list[tuple[str, Path]]:
    return [(layer, path) for layer in LAYERS for path in sorted((REPO / layer).rglob("*.py"))]


def fatpipe_imports(layer: str, path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, dotted module) of every fatpipe import in `path`, relative ones resolved, and of every
    fatpipe module the lazy adaptor loads there (`load("fatpipe.x")`)."""
    package = ["fatpipe", layer, *path.relative_to(root / layer).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if lazy_load(node).startswith("fatpipe."):
            found.append((node.lineno, lazy_load(node)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("fatpipe.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("fatpipe."):
                found.append((node.lineno, name))
    return found


def lazy_load(node: ast.AST) -> str:
    """The module a lazy adaptor's `load("name")` call names; "" for any other node."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load" and node.args \
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return ""


def test_imports_run_one_way():
    wrong = []
    for layer, path in modules():
        for line, name in fatpipe_imports(layer, path):
            target = name.split(".")[1]
            if target not in ALLOWED[layer]:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name} ({layer} may use "
                             f"{', '.join(sorted(ALLOWED[layer]))})")
    assert not wrong, "\n".join(wrong)


def trainer_folder(path: Path) -> str:
    parts = path.relative_to(REPO / "trainer").parts
    return parts[0] if len(parts) > 1 else ""


def test_the_trainers_folders_import_one_way():
    wrong = []
    for layer, path in modules():
        if layer != "trainer":
            continue
        folder = trainer_folder(path)
        allowed = TRAINER_FOLDERS[folder] | ({"api", "comm", "live"} if path.stem in BUILT_IN and not folder else set())
        for line, name in fatpipe_imports(layer, path):
            parts = name.split(".")[2:]
            target = parts[0] if parts and parts[0] in TRAINER_FOLDERS else ""
            if target not in allowed and name != "fatpipe.trainer.lazy":  # the standard library alone: for every folder
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name} (trainer/{folder} may "
                             f"use {', '.join(sorted(f or 'trainer/' for f in allowed))})")
    assert not wrong, "\n".join(wrong)


def ops_room(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root / "ops").parts
    return parts[0] if len(parts) > 1 else ""


def test_ops_holds_its_modules_in_rooms_that_import_one_way():
    loose = [p.name for p in (REPO / "ops").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"ops/ modules outside a room: {loose}"
    rooms = {p.name for p in (REPO / "ops").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(OPS_ROOMS), f"ops/ rooms {sorted(rooms)} differ from OPS_ROOMS"
    wrong = []
    for layer, path in modules():
        if layer not in ("ops",):
            continue
        room = ops_room(path)
        for line, name in fatpipe_imports(layer, path):
            parts = name.split(".")
            if parts[1] != "ops":
                continue
            target = parts[2] if len(parts) > 2 else ""
            if target not in OPS_ROOMS:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}, outside every room")
            elif OPS_ROOMS.index(target) > OPS_ROOMS.index(room) and (room, name) not in OPS_UPWARD:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}: ops/{room} comes before "
                             f"ops/{target} (rooms import only the ones before them)")
    assert not wrong, "\n".join(wrong)


def test_the_rooms_check_catches_an_import_back_up(tmp_path):
    (tmp_path / "ops" / "reach").mkdir(parents=True)
    bad = tmp_path / "ops" / "reach" / "bad.py"
    bad.write_text("from ..run.launch import launch\nfrom .transport import fan_out\n")
    found = fatpipe_imports("ops", bad, root=tmp_path)
    assert found == [(1, "fatpipe.ops.run.launch"), (2, "fatpipe.ops.reach.transport")]
    room = ops_room(bad, root=tmp_path)
    later = [n for _, n in found if OPS_ROOMS.index(n.split(".")[2]) > OPS_ROOMS.index(room)]
    assert later == ["fatpipe.ops.run.launch"]


def module_name(layer: str, path: Path) -> str:
    parts = ["fatpipe", layer, *path.relative_to(REPO / layer).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Circles not yet broken: each pair is work left, named here so no new one slips in.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def test_no_module_imports_itself_round_a_circle():
    """Imports inside functions and under TYPE_CHECKING count too: a circle hidden there still
    ties two modules into one."""
    graph = {module_name(layer, path): {name for _, name in fatpipe_imports(layer, path)}
             for layer, path in modules()}
    circles = set()

    def visit(name: str, trail: list[str]) -> None:
        for target in sorted(graph[name] & graph.keys()):
            if target in trail:
                circles.add(tuple(trail[trail.index(target):]))
            elif target not in done:
                done.add(target)
                visit(target, [*trail, target])

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            done.add(name)
            visit(name, [name])
    found = [c for c in circles if frozenset(c) not in KNOWN_CIRCLES]
    assert not found, "\n".join(" -> ".join([*c, c[0]]) for c in found)


# The run folder's writers and DDP's comm hook are built in one place each, so the built-in
# trainer and a user's script (trainer.api) record the same files the same way.
ONE_BUILDER = {
    "api/record.py": {"MetricsLog", "FaultLedger", "NodeMetrics", "NicMeter", "summarize"},
    "api/ddpcomm.py": {"TimedCommHook"},
}


def test_the_built_in_trainer_and_a_script_share_one_run_record():
    wrong = []
    for layer, path in modules():
        if layer != "trainer":
            continue
        rel = path.relative_to(REPO / "trainer").as_posix()
        others = set().union(*(names for where, names in ONE_BUILDER.items() if where != rel))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in others:
                wrong.append(f"trainer/{rel}:{node.lineno} builds {node.func.id} itself")
    assert not wrong, "\n".join(wrong)


def test_the_layers_under_the_built_in_trainer_get_its_pieces_not_the_trainer():
    """comm, api and the others sit under the built-in trainer (BUILT_IN): they get what they need
    (model, optimizer, settings) or a callback (`Trainer.rebuild_ddp`), never the Trainer itself,
    whose members no import would show them touching."""
    wrong = []
    for layer, path in modules():
        if layer != "trainer" or (path.stem in BUILT_IN and not trainer_folder(path)):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
                if "trainer" in names:
                    wrong.append(f"{path.relative_to(REPO)}:{node.lineno} takes the trainer")
    assert not wrong, "\n".join(wrong)


def test_the_check_itself_catches_an_upward_import(tmp_path):
    fake = tmp_path / "infra"
    fake.mkdir()
    (fake / "bad.py").write_text("from fatpipe.ops.run.launch import launch\nfrom .spec import X\n")
    found = fatpipe_imports("infra", fake / "bad.py", root=tmp_path)
    assert found == [(1, "fatpipe.ops.run.launch"), (2, "fatpipe.infra.spec")]
    assert [name for _, name in found if name.split(".")[1] not in ALLOWED["infra"]] == ["fatpipe.ops.run.launch"]


def test_no_command_module_imports_another():
    commands = {p.stem for p in (REPO / "cli").glob("*.py")} - CLI_SHARED
    wrong = []
    for layer, path in modules():
        if layer != "cli":
            continue
        for line, name in fatpipe_imports(layer, path):
            parts = name.split(".")
            if parts[:2] == ["fatpipe", "cli"] and len(parts) > 2 and parts[2] in commands and parts[2] != path.stem:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports the command module {name}")
    assert not wrong, "\n".join(wrong)


# Imports sit at the top of their module, so the graph these tests read is the code's whole graph
# (docs/ARCHITECTURE.md, "Imports at the top"). A function defers only a heavy optional package
# (torch, the CDK, boto3, torchft, matplotlib, ...), or a fatpipe module whose top imports one,
# through a lazy adaptor's `load("name")`: the operator's, and the trainer's own (it ships alone).
LAZY_ADAPTORS = {"infra/lazy.py", "trainer/lazy.py"}
# Modules that still import inside a function: each is work left, named here so no new one slips in.
LOCAL_IMPORTS_LEFT: set[str] = set()  # none left
# What `fatpipe --help`, and the import of any command's module, must leave unloaded: each loads
# when a command uses it.
HEAVY_AT_START = ("torch", "torchft", "cdktf", "cdktn", "constructs", "jsii", "boto3", "botocore", "matplotlib")


def function_level_imports(tree: ast.Module) -> list[int]:
    """The lines of the imports inside a function or a class (an `if TYPE_CHECKING:` block aside)."""
    found = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child.lineno)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                      ast.Lambda)))

    visit(tree, False)
    return found


def test_imports_sit_at_the_top_of_their_module():
    wrong = []
    for _, path in modules():
        rel = path.relative_to(REPO).as_posix()
        if rel in LAZY_ADAPTORS or rel in LOCAL_IMPORTS_LEFT:
            continue
        lines = function_level_imports(ast.parse(path.read_text()))
        wrong += [f"{rel}:{line} imports inside a function (hoist it, or load a heavy package through "
                  f"{' / '.join(sorted(LAZY_ADAPTORS))})" for line in lines]
    assert not wrong, "\n".join(wrong)


def test_the_top_imports_check_itself_tells_a_function_import_from_the_rest():
    tree = ast.parse("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                     "try:\n    import psutil\nexcept ImportError:\n    psutil = None\n\n"
                     "def f():\n    import json\n    if True:\n        from .x import y\n\n"
                     "class C:\n    from .z import w\n")
    assert function_level_imports(tree) == [11, 13, 16]


def heavy_modules() -> set[str]:
    """The fatpipe modules whose top imports a heavy package: a lazy adaptor's HEAVY, a CDK name
    from stacks.toolkit (its `__getattr__` imports the toolkit), or another such module."""
    from fatpipe.infra.lazy import HEAVY
    from fatpipe.stacks.toolkit import CORE_NAMES
    from fatpipe.trainer.lazy import HEAVY as TRAINER_HEAVY

    heavy, tops = set(), {}
    for layer, path in modules():
        tree, name = ast.parse(path.read_text()), module_name(layer, path)
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        roots = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        roots |= {(n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and not n.level}
        cdk = any(isinstance(n, ast.ImportFrom) and (n.module or "").endswith("toolkit")
                  and {a.name for a in n.names} & {*CORE_NAMES, "Construct"} for n in top)
        if roots & (HEAVY | TRAINER_HEAVY) or cdk:
            heavy.add(name)
        lines = {n.lineno for n in top}
        tops[name] = {target for line, target in fatpipe_imports(layer, path) if line in lines}
    while grown := {name for name, targets in tops.items() if name not in heavy and targets & heavy}:
        heavy |= grown
    return heavy


def test_a_lazy_load_defers_only_what_is_heavy():
    heavy, wrong = heavy_modules(), []
    for _, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            name = lazy_load(node)
            if name.startswith("fatpipe.") and name not in heavy:
                wrong.append(f"{path.relative_to(REPO)}:{node.lineno} loads {name}, which imports nothing heavy: "
                             "import it at the top")
    assert not wrong, "\n".join(wrong)


# The modules of a command's bodies (cli/declare.py's BodyCommand names each), its subcommands' too
# (a lazy group names their modules in `targets`).
BODIES = ("def bodies(command):\n"
          "    if hasattr(command, 'targets'):\n"
          "        return [target.split(':')[0] for target in command.targets.values()]\n"
          "    if hasattr(command, 'commands'):\n"
          "        return [b for sub in command.commands.values() for b in bodies(sub)]\n"
          "    return [getattr(command, 'body', command.callback.__module__ + ':').split(':')[0]]\n")
# Bodies that still load torch on import: work left, named so no other slips in. `data prepare`
# reads text files through trainer.data, whose top imports torch.
TORCH_BODIES = {"fatpipe.cli.dataprep"}
# The commands whose help lists one --flag per [train] key, so it loads [train]'s model (pydantic).
TRAIN_FLAGS = ("up", "rendezvous", "launch", "train")


def test_fatpipe_help_and_every_command_module_load_no_heavy_package():
    """`fatpipe --help` starts in a tenth of a second, and a command loads torch, the CDK or a
    cloud SDK only when it uses one: neither the help nor importing any command's declaration and
    body loads them."""
    probe = ("import importlib, sys\nfrom fatpipe.cli.main import COMMANDS, HIDDEN, cli\n"
             "try:\n    cli(['--help'], prog_name='fatpipe')\nexcept SystemExit:\n    pass\n"
             f"heavy = {HEAVY_AT_START!r}\n"
             "print('help', sorted(m for m in sys.modules if m.split('.')[0] in heavy), file=sys.stderr)\n"
             f"{BODIES}"
             "for target in [t for t, _ in COMMANDS.values()] + list(HIDDEN.values()):\n"
             "    module, attr = target.split(':')\n"
             "    for body in bodies(getattr(importlib.import_module(module), attr)):\n"
             f"        if body not in {TORCH_BODIES!r}:\n"
             "            importlib.import_module(body)\n"
             "print('commands', sorted({m.split('.')[0] for m in sys.modules} & set(heavy)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "help []" in done.stderr and "commands []" in done.stderr, done.stderr


def test_a_commands_help_loads_its_declaration_not_its_body():
    """`fatpipe <command> --help` imports the command's declaration (its options and help), not its
    body: no ops, stacks or rich, no pydantic model but [train]'s where the help lists its keys."""
    probe = ("import contextlib, io, json, sys\nfrom fatpipe.cli.main import COMMANDS, cli\n"
             f"{BODIES}"
             f"train = {TRAIN_FLAGS!r}\n"
             "found, seen = {}, set(sys.modules)\n"
             "for name in sorted(COMMANDS, key=lambda n: n in train):  # [train]'s model loads last\n"
             "    try:\n"
             "        with contextlib.redirect_stdout(io.StringIO()):\n"
             "            cli([name, '--help'], prog_name='fatpipe')\n"
             "    except SystemExit:\n"
             "        pass\n"
             "    found[name], seen = sorted(set(sys.modules) - seen), set(sys.modules)\n"
             "body = {b for t, _ in COMMANDS.values() for b in bodies(getattr(sys.modules[t.split(':')[0]], t.split(':')[1]))}\n"
             "print(json.dumps({name: [m for m in new if m in body or m.startswith(('fatpipe.ops', 'fatpipe.stacks'))\n"
             "                         or m.split('.')[0] == 'rich' or (m.split('.')[0] == 'pydantic' and name not in train)]\n"
             "                  for name, new in found.items()}))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert {name: modules for name, modules in loaded.items() if modules} == {}


# What a command that neither deploys nor launches must not load (its `--help` pays for every import
# at its top): the shared cli steps live by what they serve (cli/steps.py), so none is a hub.
NOT_LOADED = {
    "status": ("fatpipe.stacks.engine", "fatpipe.ops.run.launch"),
    "logs": ("fatpipe.stacks.engine", "fatpipe.ops.run.launch"),
    "runs": ("fatpipe.stacks.engine", "fatpipe.ops.run.launch", "fatpipe.ops.run.pullpaths"),  # pulls: pullrun.py
    "wait": ("fatpipe.stacks.engine", "fatpipe.ops.run.launch", "fatpipe.ops.net.check"),
    "rendezvous": ("fatpipe.stacks.engine", "fatpipe.ops.run.launch"),
    "netcheck": ("fatpipe.stacks.engine",),
}


def test_a_command_loads_only_the_steps_it_uses():
    probe = ("import importlib, json, sys\n"
             f"command, unwanted = sys.argv[1], {NOT_LOADED!r}[sys.argv[1]]\n"
             "importlib.import_module(f'fatpipe.cli.{command}')\n"
             "print(json.dumps([m for m in unwanted if m in sys.modules]))\n")
    loaded = {}
    for command in NOT_LOADED:
        done = subprocess.run([sys.executable, "-c", probe, command], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
        assert done.returncode == 0, done.stderr
        loaded[command] = json.loads(done.stdout)
    assert loaded == {command: [] for command in NOT_LOADED}


def test_the_model_layer_runs_nothing_and_prints_nothing():
    for path in (REPO / "infra").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not names & {"subprocess", "rich", "click"}, f"{path.name} imports {names & {'subprocess', 'rich', 'click'}}"
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "print"]
        assert not calls, f"{path.name} prints"


def test_modules_and_functions_stay_small():
    big, wide = [], []
    for _, path in modules():
        lines = len(path.read_text().splitlines())
        if lines >= MAX_MODULE_LINES:
            big.append(f"{path.relative_to(REPO)}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
                params += [p.arg for p in (a.vararg, a.kwarg) if p]
                if len(params) > MAX_PARAMETERS:
                    wide.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} takes {len(params)}")
    assert not big, f"modules of {MAX_MODULE_LINES} lines or more:\n" + "\n".join(big)
    assert not wide, f"functions over {MAX_PARAMETERS} parameters:\n" + "\n".join(wide)


def test_train_keys_are_the_trainers_flags():
    """[train] (TrainSpec) and the trainer's TrainConfig must agree: the trainer imports nothing else."""
    from fatpipe.infra.trainspec import TrainSpec
    from fatpipe.trainer.config import COMMS, FAULT_TOLERANCE, PRESETS, TrainConfig

    config = TrainConfig()
    for name, field in TrainSpec.model_fields.items():
        assert hasattr(config, name), f"[train] {name} is no trainer flag"
        assert field.default == getattr(config, name), f"[train] {name}: {field.default} vs {getattr(config, name)}"
    assert get_args(TrainSpec.model_fields["comm"].annotation) == COMMS
    assert get_args(TrainSpec.model_fields["preset"].annotation) == PRESETS
    assert get_args(TrainSpec.model_fields["fault_tolerance"].annotation) == FAULT_TOLERANCE


def test_p2p_tools_are_the_trainers():
    from fatpipe.infra.defaults import P2P_TOOLS
    from fatpipe.trainer.net.p2p import TOOLS

    assert P2P_TOOLS == TOOLS


@pytest.mark.parametrize("provider", ["sim", "aws", "digitalocean"])
def test_every_provider_is_registered_with_its_cluster_model(provider):
    from fatpipe.infra.clusters import CLUSTER_MODELS
    from fatpipe.stacks.providers import PROVIDERS, Provider

    assert set(PROVIDERS) == set(CLUSTER_MODELS)
    assert isinstance(PROVIDERS[provider], Provider) and PROVIDERS[provider].name == provider


# Providers own their differences (docs/ARCHITECTURE.md, "Adding a provider"): what differs by
# provider is a method of its `Provider` (stacks/providers/) or, for facts the cluster file's
# layers own, a class attribute of its cluster model (infra), never a branch on its name.
PROVIDER_NAMES = {"sim", "aws", "digitalocean", "ssh", "vm"}
# "ssh" is a transport too (`node.transport == "ssh"`): it counts only against a provider's value.
TRANSPORT_TOO = {"ssh"}


def _names_a_provider(node: ast.AST) -> bool:
    return "provider" in ast.unparse(node).lower()


def _provider_literals(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and node.value in PROVIDER_NAMES:
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_provider_literals(e) for e in node.elts))
    return set()


def provider_branches(path: Path, root: Path = REPO) -> list[str]:
    """Each comparison, membership test or match of `path` against a provider name literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            pairs = [(s, o) for s in sides for o in sides if o is not s]
        elif isinstance(node, ast.Match):
            values = [v.value for case in node.cases for v in ast.walk(case.pattern) if isinstance(v, ast.MatchValue)]
            pairs = [(v, node.subject) for v in values]
        else:
            continue
        for literal, other in pairs:
            names = _provider_literals(literal)
            if names - TRANSPORT_TOO or (names and _names_a_provider(other)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)[:80]}")
                break
    return found


def test_no_branch_on_a_provider_name_outside_the_providers():
    wrong = [line for layer, path in modules() if "providers" not in path.relative_to(REPO / layer).parts
             for line in provider_branches(path)]
    assert not wrong, "ask the provider (stacks/providers/) or its cluster model (infra):\n" + "\n".join(wrong)


def test_the_provider_check_itself_catches_each_kind_of_branch(tmp_path):
    path = tmp_path / "branchy.py"
    cases = {"if cluster.provider == 'aws': pass": 1, "x = provider in ('sim', 'vm')": 1,
             "match spec.provider:\n    case 'digitalocean': pass": 1, "if kind != 'vm': pass": 1,
             "if node.transport == 'ssh': pass": 0, "if provider.name == 'ssh': pass": 1}
    for source, expected in cases.items():
        path.write_text(source + "\n")
        assert len(provider_branches(path, tmp_path)) == expected, source


def test_the_terraform_engine_knows_no_emulator():
    """The sim's namespaces and the vm's QEMU are rooms of their own (stacks/sim/, stacks/vm/),
    reached in stacks only through their providers."""
    wrong = [f"{path.relative_to(REPO)}:{line} imports {name}" for layer, path in modules() if layer == "stacks"
             and path.relative_to(REPO / "stacks").parts[0] not in ("providers", "sim", "vm")
             for line, name in fatpipe_imports(layer, path)
             if name.split(".")[:3] in (["fatpipe", "stacks", "sim"], ["fatpipe", "stacks", "vm"])]
    assert not wrong, "\n".join(wrong)


# The node boundary (docs/ARCHITECTURE.md, "The node boundary"): what ops sends to a node lives in
# node/, runs on a node's system Python 3.8 with the standard library alone, and no module of
# another layer shares a node program's name.
NODE_SIBLINGS = {p.stem for p in (REPO / "node").glob("*.py")}  # loaded beside each other by name


@pytest.mark.parametrize("path", sorted((REPO / "node").glob("*.py")), ids=lambda p: p.name)
def test_node_programs_are_standard_library_python_3_8(path):
    import sys

    source = path.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names
               and name not in NODE_SIBLINGS and name != "fatpipe.node" and not name.startswith("fatpipe.node.")}
    assert not outside, f"{path.name} imports {sorted(outside)}: a node has the standard library alone"
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], \
        f"{path.name}: a relative import, which a program sent as text cannot make"
    # Python 3.9 that 3.8's grammar still parses (annotations are never evaluated: `from __future__`).
    assert not re.search(r"\.remove(prefix|suffix)\(|\bmatch \w+:", source), path.name


def test_no_module_of_another_layer_has_a_node_programs_name():
    others = {path.stem: path for layer, path in modules() if layer != "node"}
    shared = sorted(f"node/{name}.py and {others[name].relative_to(REPO)}"
                    for name in NODE_SIBLINGS - {"__init__"} if name in others)
    assert not shared, "same-named modules across layers: " + "; ".join(shared)


def test_ops_sends_no_program_of_its_own():
    """A program ops sends is read from node/ (`fatpipe.node.source_file`), never from a file
    beside an ops module."""
    wrong = []
    for layer, path in modules():
        if layer in ("ops", "cli", "stacks"):
            for n in ast.walk(ast.parse(path.read_text())):
                if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "with_name" and any(
                        isinstance(a, ast.Constant) and str(a.value).endswith(".py") for a in n.args):
                    wrong.append(f"{path.relative_to(REPO)}:{n.lineno} reads {n.args[0].value!r} beside it")
    assert not wrong, "\n".join(wrong)


# Item "one cluster object per command" (docs/ARCHITECTURE.md, "Inside ops"): a command resolves its
# cluster once (ops/reach/cluster.py, `Cluster.resolve`) and hands that object on; ops and stacks
# never look a cluster's declaration up by name again (LOOKUPS), and ops never derive its files
# from its name either (`<project>.state_dir(` and infra/runs.py's helpers taking a project and a
# cluster name: the Cluster's `state_dir`, `outputs_path`, `runs_dir`, `load_outputs` and
# `find_run` stand in). The stacks hold no Cluster (they cannot import ops): they derive the state
# folder from the name of the spec or outputs they were handed, so only LOOKUPS are refused there.
# `fatpipe plan` resolves no cluster: it hands each declared model on as a Cluster of its own.
# The places that still resolve one, and why:
CLUSTER_RESOLVERS = {
    "ops/reach/cluster.py",  # `Cluster.resolve` and its properties: the one lookup a command makes, and its files
}
LOOKUPS = ("project.cluster(", "cluster_data(", "cluster_node(")


def name_helpers() -> set[str]:
    """infra/runs.py's functions taking `(project, cluster_name, ...)`: a cluster's files by its name."""
    tree = ast.parse((REPO / "infra" / "runs.py").read_text())
    return {f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and [a.arg for a in f.args.args[:2]] == ["project", "cluster_name"]}


def cluster_lookups(path: Path) -> list[tuple[int, str]]:
    """(line, what) of every name lookup of a cluster in `path`: `<project>.cluster(...)`,
    `cluster_data(...)` and `cluster_node(...)`; and of its files by its name: `<project>.state_dir(...)`
    and an infra/runs.py helper given a project and a name, under whatever name it is imported."""
    tree = ast.parse(path.read_text())
    helpers = name_helpers()
    aliases = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and (n.module or "").split(".")[-1] == "runs" for a in n.names}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = getattr(func, "id", getattr(func, "attr", None))
        owner = func.value if isinstance(func, ast.Attribute) else None
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if owner_name == "project" and called in ("cluster", "state_dir"):
            found.append((node.lineno, f"project.{called}("))
        elif called in ("cluster_data", "cluster_node"):
            found.append((node.lineno, f"{called}("))
        elif aliases.get(called, called) in helpers and len(node.args) + len(node.keywords) >= 2:
            found.append((node.lineno, f"{aliases.get(called, called)}("))
    return sorted(found)


def test_ops_and_stacks_take_the_commands_cluster_and_look_none_up_by_name():
    wrong = []
    for layer, path in modules():
        rel = path.relative_to(REPO).as_posix()
        if layer in ("ops", "stacks") and rel not in CLUSTER_RESOLVERS:
            wrong += [f"{rel}:{line} {what}" for line, what in cluster_lookups(path)
                      if layer == "ops" or what in LOOKUPS]
    assert not wrong, "a cluster looked up by name after the command resolved it (take its Cluster):\n" + \
        "\n".join(wrong)


def test_the_cluster_lookup_check_catches_every_form(tmp_path):
    assert {"outputs_file", "load_outputs", "runs_dir", "find_run"} <= name_helpers()
    bad = tmp_path / "bad.py"
    bad.write_text("from fatpipe.infra.runs import outputs_file as outputs_path, new_run_id\n"
                   "def f(project, self, cluster):\n    project.cluster('a')\n    self.project.cluster(None)\n"
                   "    cluster_data(project.spec, 'a')\n    infra.dataspec.cluster_data(1, 2)\n"
                   "    cluster.name\n    other.cluster('a')\n"
                   "    project.state_dir('a')\n    cluster.project.state_dir(cluster.name)\n"
                   "    cluster_node(project.spec, 'a')\n    runs_dir(project, 'a')\n"
                   "    outputs_path(cluster.project, cluster.name)\n    runs.find_run(project, cluster_name='a')\n"
                   "    cluster.find_run('r')\n    cluster.state_dir\n    cluster.load_outputs(None)\n"
                   "    new_run_id()\n")
    assert cluster_lookups(bad) == [(3, "project.cluster("), (4, "project.cluster("), (5, "cluster_data("),
                                    (6, "cluster_data("), (9, "project.state_dir("), (10, "project.state_dir("),
                                    (11, "cluster_node("), (12, "runs_dir("), (13, "outputs_file("),
                                    (14, "find_run(")]


def test_a_commands_node_answers_are_its_clusters_not_module_state():
    """ops/reach/asknode.py keeps no answers of its own: two clusters in one process share none."""
    from fatpipe.ops.reach import asknode
    from fatpipe.ops.reach.asknode import Step, kept, recall, remember
    from fatpipe.ops.reach.cluster import Cluster
    from fatpipe.ops.reach.transport import LocalTransport

    assert not [name for name, value in vars(asknode).items() if isinstance(value, (dict, list, set))
                and not name.startswith("__")], "module-level state in asknode"
    first, second = Cluster(None, outputs=None), Cluster(None, outputs=None)
    step = Step("read_line", ("f.txt",))
    one, two = LocalTransport("n0"), LocalTransport("n0")
    one.answers, two.answers = first.answers, second.answers
    remember(one, [step], [{"ok": "1"}])
    assert recall(two, step) is None and recall(one, step) == {"ok": "1"}
    with first.answers.keeping():
        assert kept(one, step) is None


def test_no_module_reads_clicks_context_as_a_hidden_argument():
    """A command gets what its options stored as its `Request` (cli/options.py, `pass_request`):
    nothing calls click.get_current_context() to read them behind its parameters."""
    wrong = [f"{path.relative_to(REPO)}:{node.lineno}" for _, path in modules()
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "get_current_context"]
    assert not wrong, "click's context read as a hidden argument:\n" + "\n".join(wrong)


def test_a_node_programs_step_names_the_module_by_its_file():
    """`Step("module.function", ...)`: the module a node loads under that name is node/<module>.py."""
    wrong = []
    for layer, path in modules():
        if layer == "ops":
            for n in ast.walk(ast.parse(path.read_text())):
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Step" and n.args \
                        and isinstance(n.args[0], ast.Constant) and "." in str(n.args[0].value):
                    module = str(n.args[0].value).split(".")[0]
                    if module not in NODE_SIBLINGS:
                        wrong.append(f"{path.relative_to(REPO)}:{n.lineno} calls {n.args[0].value!r}")
    assert not wrong, "\n".join(wrong)
