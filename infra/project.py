"""Find, read and validate fatpipe.toml (or the embedded default) into a `Project`."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from .errors import ConfigError
from .files import write_atomic
from .spec import PROVIDERS, ProjectSpec
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
        path = self.root / STATE_DIR_NAME / PROJECT_ID_FILE
        try:
            found = path.read_text().strip()
        except FileNotFoundError:
            found = ""
        if re.fullmatch(r"[0-9a-f]{8}", found):
            return found
        write_atomic(path, secrets.token_hex(4) + "\n")
        return path.read_text().strip()


def config_path(explicit: str | os.PathLike | None = None) -> Path:
    """The cluster file to read: --config, then $FATPIPE_CONFIG, then ./fatpipe.toml."""
    return Path(explicit or os.environ.get("FATPIPE_CONFIG") or CONFIG_NAME)


def load_project(explicit: str | os.PathLike | None = None) -> Project:
    path = config_path(explicit)
    if not path.exists():
        if explicit or os.environ.get("FATPIPE_CONFIG"):
            raise ConfigError(f"{path}: no such file")
        return Project(parse_project(DEFAULT_TOML, "embedded default"), Path.cwd(), None)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    return Project(parse_project(text, str(path)), path.resolve().parent, path)


def parse_project(text: str, label: str) -> ProjectSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{label}: {_toml_message(e)}") from None
    try:
        return ProjectSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{label}: {_first_error(e, data)}") from None


def _toml_message(error: Exception) -> str:
    message = str(error)
    twice = re.match(r"Cannot declare \((.*)\) twice(.*)", message)
    if twice:
        key = ".".join(part.strip(" '\"") for part in twice.group(1).split(","))
        return f"{key} is declared twice{twice.group(2)}; names must be unique"
    return f"not valid TOML: {message}"


def _first_error(error: ValidationError, data: dict) -> str:
    """One line naming the key and what is allowed, from pydantic's first error."""
    err = error.errors(include_url=False)[0]
    loc = [str(p) for p in err["loc"]]
    # A discriminated union puts the provider tag into the path: clusters.x.aws.nodes.
    if len(loc) > 2 and loc[0] == "clusters" and loc[2] in PROVIDERS:
        del loc[2]
    key = ".".join(loc) or "(top level)"
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return f"{key}: unknown key; allowed: {', '.join(_allowed_keys(loc, data))}"
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
    from .spec import CLUSTER_MODELS, Backend

    if loc[:1] == ["train"]:
        model = TrainSpec
    elif loc[:1] == ["clusters"] and len(loc) >= 3:
        provider = data.get("clusters", {}).get(loc[1], {}).get("provider")
        model = CLUSTER_MODELS[provider]
        if loc[2] == "backend":
            model = Backend
    else:
        return ["clusters", "train"]
    return [name for name in model.model_fields if name != "name"]
