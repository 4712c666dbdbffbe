"""The `[node]` table: what every node's Python environment holds (docs/ARCHITECTURE.md, "The node environment").

Project-wide (`[node]`) and per cluster (`[clusters.<name>.node]`): each key a cluster sets
replaces the project's value for that key, the others stay (`cluster_node`).

Each value reaches pip on the node as one quoted argument, never as shell text, so each is
checked here: requirements parse as PEP 508 (`packaging.requirements.Requirement`), the
requirements file is a plain path inside the project, the index is an http(s) URL.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import Field, field_validator

from .trainspec import Strict

CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # CPU nodes: no GBs of CUDA libraries
DEFAULT_REQUIREMENTS = "requirements.txt"


def requirement(text: str) -> str:
    """`text` as a normalized PEP 508 requirement, or a ValueError naming it."""
    if not isinstance(text, str) or text != text.strip() or not text or text.startswith("-"):
        raise ValueError(f"{text!r} is not a requirement such as \"einops>=0.7\"")
    try:
        parsed = Requirement(text)
    except InvalidRequirement as e:  # its message goes on with the text and a caret: the first line only
        reason = str(e).splitlines()[0]
        raise ValueError(f"{text!r} is not a requirement such as \"einops>=0.7\" ({reason})") from None
    if parsed.url:
        raise ValueError(f"{text!r}: a URL requirement is not accepted; name a package and a version")
    return str(parsed)


class NodeSpec(Strict):
    """Extra packages, the requirements file and the torch build every node's venv installs."""

    packages: list[str] = Field(default_factory=list)
    requirements: str | None = None  # default: requirements.txt when the project has one
    torch: str | None = None  # default: $FATPIPE_TORCH, else this machine's torch version
    torch_index: str | None = None  # default: $FATPIPE_TORCH_INDEX_URL, else by the nodes' GPUs

    @field_validator("packages")
    @classmethod
    def _packages(cls, value: list[str]) -> list[str]:
        return [requirement(item) for item in value]

    @field_validator("torch")
    @classmethod
    def _torch(cls, value: str | None) -> str | None:
        if value is None:
            return None
        normal = requirement(value)
        if Requirement(normal).name.lower() != "torch":
            raise ValueError(f"{value!r} does not name torch (e.g. \"torch==2.13.0\")")
        return normal

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, value: str | None) -> str | None:
        if value is None:
            return None
        path = PurePosixPath(value)
        if (not value or value.startswith("-") or path.is_absolute() or ".." in path.parts
                or any(ord(c) < 32 for c in value)):
            raise ValueError(f"requirements = {value!r}: give a file inside the project folder, "
                             "e.g. \"requirements.txt\"")
        return value

    @field_validator("torch_index")
    @classmethod
    def _index(cls, value: str | None) -> str | None:
        if value is None:
            return None
        url = urlsplit(value)
        if url.scheme not in ("http", "https") or not url.netloc or any(c.isspace() for c in value):
            raise ValueError(f"torch_index = {value!r} is not an http(s) URL such as {CPU_TORCH_INDEX}")
        return value


def cluster_node(spec, cluster_name: str) -> NodeSpec:
    """The node environment the named cluster's nodes get (`node_of` its entry)."""
    return node_of(spec.node, spec.clusters.get(cluster_name))


def node_of(project_node: NodeSpec, cluster) -> NodeSpec:
    """The node environment the nodes of `cluster` (its model, infra.clusters; None: the project's
    alone) get: the project's `[node]`, with each key its own `[clusters.<name>.node]` sets in
    place of the project's (a list replaces the list whole)."""
    own = getattr(cluster, "node", None)
    if own is None:
        return project_node
    return project_node.model_copy(update={key: getattr(own, key) for key in own.model_fields_set})


def node_table(cluster, key: str) -> str:
    """The table the value of `key` of `cluster` (its model, or None) comes from, as the user
    wrote it: for error messages."""
    own = getattr(cluster, "node", None)
    return f"[clusters.{cluster.name}.node]" if own is not None and key in own.model_fields_set else "[node]"
