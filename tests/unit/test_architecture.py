"""The layers of docs/ARCHITECTURE.md hold: imports run one way, modules and functions stay small,
and what two layers must both define is defined the same way."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("infra", "stacks", "ops", "cli", "trainer")
# Which fatpipe packages each layer may import (its own included).
ALLOWED = {
    "infra": {"infra"},
    "stacks": {"infra", "stacks"},
    "ops": {"infra", "ops", "trainer"},  # ops ships the trainer package and runs its benchmark
    "cli": {"infra", "stacks", "ops", "cli", "trainer"},
    "trainer": {"trainer"},  # runs on a node with torch alone
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
CLI_SHARED = {"__init__", "__main__", "main", "options", "render", "steps", "downafter", "signals"}
MAX_MODULE_LINES = 300
MAX_PARAMETERS = 8


def modules() -> list[tuple[str, Path]]:
    return [(layer, path) for layer in LAYERS for path in sorted((REPO / layer).rglob("*.py"))]


def fatpipe_imports(layer: str, path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, dotted module) of every fatpipe import in `path`, relative ones resolved."""
    package = ["fatpipe", layer, *path.relative_to(root / layer).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
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
            if target not in allowed:
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
