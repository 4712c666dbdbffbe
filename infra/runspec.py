"""`[run]`: what every run of the project brings back besides its run folder, and the rule a
path pulled from a node follows (docs/ARCHITECTURE.md, "Getting results back")."""

from __future__ import annotations

from pydantic import Field, field_validator

from .dataspec import landing_path
from .errors import ConfigError
from .trainspec import Strict


def pull_path(value: str) -> str:
    """`value` as a path inside a node's project folder, normalised (`./out/` is `out`); a
    ConfigError naming it when it is absolute, leaves the folder (`..`), names the folder itself,
    lies in `.fatpipe/` or `.git/`, or holds characters rsync reads as patterns."""
    try:
        return landing_path(value)
    except ValueError as e:
        raise ConfigError(str(e)) from None


class RunSpec(Strict):
    # Paths (files or folders) that a user's script writes in the project folder of the node of
    # rank 0, such as its checkpoints: pulled after every `up`, `launch` and `stop`, replacing the
    # local copy.
    pull: list[str] = Field(default_factory=list)

    @field_validator("pull")
    @classmethod
    def _inside_the_project(cls, paths: list[str]) -> list[str]:
        return list(dict.fromkeys(landing_path(p) for p in paths))  # a ValueError names the path
