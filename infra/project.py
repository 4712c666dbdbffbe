"""Find, read and validate fatpipe.toml (or the embedded default) into a `Project`."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from .clusters import CLUSTER_MODELS, PROVIDERS, ProjectSpec
from .dataspec import DataSpec
from .errors import ConfigError
from .nodespec import NodeSpec
from .runspec import RunSpec
from .spec import Backend
from .templates import SIM as DEFAULT_TOML
from .trainspec import TrainSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_NAME = "fatpipe.toml"
STATE_DIR_NAME = ".fatpipe"
PROJECT_ID_FILE = "project-id"


@dataclass(frozen=True)
class Project:
    """A validated cluster file and the folder whose `.fatpipe/` holds its state."""

    spec: ProjectSpec
    root: Path
    path: Path | None  # None: the embedded default

    @property
    def clusters(self):
        return self.spec.clusters

    @property
    def train(self) -> TrainSpec:
        return self.spec.train

    @property
    def label(self) -> str:
        return str(self.path) if self.path else "embedded default"

    def cluster(self, name: str | None = None):
        """The named cluster, or the only one when no name is given."""
        if name is None:
            if len(self.clusters) == 1:
                return next(iter(self.clusters.values()))
            raise ConfigError(f"{self.label} declares several clusters ({', '.join(self.clusters)}): name one")
        if name not in self.clusters:
            raise ConfigError(f"{self.label}: no cluster {name!r}; declared: {', '.join(self.clusters)}")
        return self.clusters[name]

    def with_cluster(self, cluster) -> Project:
        """This project with `cluster` in place of the one of the same name."""
        clusters = {**self.clusters, cluster.name: cluster}
        return dataclasses.replace(self, spec=self.spec.model_copy(update={"clusters": clusters}))

    def state_dir(self, cluster_name: str) -> Path:
        return self.root / STATE_DIR_NAME / cluster_name

    @property
    def project_id(self) -> str:
        """This project's stable random id (`.fatpipe/project-id`, made on first use).

        Cloud names, tags and state keys carry it, so two projects with a cluster of the same
        name in one account never collide, and a sim node can tell whose it is.
        """
        return project_id_at(self.root)


def project_id_at(root: Path, create: bool = True) -> str | None:
    """The id in `<root>/.fatpipe/project-id`; made when missing (unless not `create`: None).

    A file that is there but holds no id is an error, never replaced: what the project deployed
    carries the old id, and a new one would disown it.
    """
    path = Path(root) / STATE_DIR_NAME / PROJECT_ID_FILE
    try:
        found = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        if not create:
            return None
        _create_id(path)
        return project_id_at(root, create=False)
    if re.fullmatch(r"[0-9a-f]{8}", found):
        return found
    raise ConfigError(
        f"{path}: holds no project id ({found[:16]!r}; 8 hex digits expected). What this project deployed "
        "carries its id (sim nodes' owner.json, cloud names): put it back, or delete the file to start "
        "a new identity after removing what the old one made"
    )


def _create_id(path: Path) -> None:
    """Write a new id unless another process got there first (sim nodes come up in parallel)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(2)}.tmp")
    tmp.write_text(secrets.token_hex(4) + "\n")
    try:
        os.link(tmp, path)  # atomic, and fails when the file exists: the first id wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def config_path(explicit: str | os.PathLike | None = None) -> Path:
    """The cluster file to read: --config, then $FATPIPE_CONFIG, then ./fatpipe.toml."""
    return Path(explicit or os.environ.get("FATPIPE_CONFIG") or CONFIG_NAME)


def load_project(explicit: str | os.PathLike | None = None, clusters_optional: bool = False) -> Project:
    """The project of the cluster file (or the embedded default). `clusters_optional`: a file with
    only a [train] table will do (`fatpipe train` needs no cluster): the default's cluster fills in."""
    path = config_path(explicit)
    if not path.exists():
        if explicit or os.environ.get("FATPIPE_CONFIG"):
            raise ConfigError(f"{path}: no such file")
        return Project(parse_project(DEFAULT_TOML, "embedded default"), Path.cwd(), None)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (it is not UTF-8)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    fallback = tomllib.loads(DEFAULT_TOML)["clusters"] if clusters_optional else None
    return Project(parse_project(text, str(path), fallback), path.resolve().parent, path)


def parse_project(text: str, label: str, default_clusters: dict | None = None) -> ProjectSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{label}: {_toml_message(e)}") from None
    if default_clusters is not None and "clusters" not in data:
        data["clusters"] = default_clusters
    try:
        return ProjectSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(error_report(label, validation_messages(e, data))) from None


def error_report(label: str, messages: list[str]) -> str:
    """One line for one problem; a count and one line each for several (all at once, not the first)."""
    if len(messages) == 1:
        return f"{label}: {messages[0]}"
    return f"{label}: {len(messages)} problems:\n" + "\n".join(f"  {m}" for m in messages)


def validation_messages(error: ValidationError, data: dict) -> list[str]:
    """Every problem pydantic found, each one line naming the key and what is allowed."""
    messages: list[str] = []
    for err in error.errors(include_url=False):
        message = _describe(err, data)
        if message not in messages:
            messages.append(message)
    return messages


def train_warnings(train: TrainSpec) -> list[str]:
    """Settings that are valid but surely not meant."""
    warnings = []
    if train.steps <= train.warmup_steps:
        warnings.append(f"steps ({train.steps}) is not above warmup_steps ({train.warmup_steps}): the "
                        "learning rate never finishes warming up (raise steps or lower warmup_steps)")
    return warnings


def _toml_message(error: Exception) -> str:
    message = str(error)
    twice = re.match(r"Cannot declare \((.*)\) twice(.*)", message)
    if twice:
        key = ".".join(part.strip(" '\"") for part in twice.group(1).split(","))
        return f"{key} is declared twice{twice.group(2)}; names must be unique"
    return f"not valid TOML: {message}"


def _describe(err: dict, data: dict) -> str:
    """One line naming the key and what is allowed, from one pydantic error."""
    loc = [str(p) for p in err["loc"]]
    # A discriminated union puts the provider tag into the path: clusters.x.aws.nodes.
    if len(loc) > 2 and loc[0] == "clusters" and loc[2] in PROVIDERS:
        del loc[2]
    key = ".".join(loc) or "(top level)"
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc, data)
        close = difflib.get_close_matches(loc[-1], allowed, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"{key}: unknown key; {hint}allowed: {', '.join(allowed)}"
    if kind == "union_tag_not_found":
        return f"{key}.provider: missing; allowed: {', '.join(PROVIDERS)}"
    if kind == "union_tag_invalid":
        given = err.get("ctx", {}).get("tag", "?")
        return f"{key}.provider: {given!r} is not a provider; allowed: {', '.join(PROVIDERS)}"
    if kind == "missing":
        return f"{key}: required but missing"
    if kind == "literal_error":
        return f"{key}: {err['input']!r} is not allowed; {msg.replace('Input should be', 'allowed:')}"
    if kind == "too_short" and key == "clusters":
        return "clusters: declare at least one [clusters.<name>] table"
    msg = msg.removeprefix("Value error, ")
    return f"{key}: {msg}"


def _allowed_keys(loc: list[str], data: dict) -> list[str]:
    if loc[:1] == ["train"]:
        model = TrainSpec
    elif loc[:1] == ["node"]:
        model = NodeSpec
    elif loc[:1] == ["data"]:
        model = DataSpec
    elif loc[:1] == ["run"]:
        model = RunSpec
    elif loc[:1] == ["clusters"] and len(loc) >= 3:
        provider = data.get("clusters", {}).get(loc[1], {}).get("provider")
        model = CLUSTER_MODELS[provider]
        if loc[2] in ("backend", "data", "node") and len(loc) > 3:
            model = {"backend": Backend, "data": DataSpec, "node": NodeSpec}[loc[2]]
    else:
        return ["clusters", "train", "node", "data", "run"]
    return [name for name in model.model_fields if name != "name"]
