"""`fatpipe plan --write`: add the plan's chosen cluster to the cluster file, whole or not at all."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .clusters import CLUSTER_MODELS
from .errors import ConfigError
from .files import write_atomic
from .project import parse_project

# Where a cluster of the file gives none to copy: the regions the offline prices are for.
DEFAULT_REGION = {"aws": "us-east-1", "digitalocean": "nyc3"}
# The providers whose cluster tables name a machine type, and the key that does.
MACHINE_KEY = {name: model.machine_field for name, model in CLUSTER_MODELS.items() if model.machine_field}
NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")


def cluster_block(name: str, provider: str, machine: str, tier: str, nodes: int, gpus: int,
                  like=None) -> str:
    """The `[clusters.NAME]` table; region, key and SSH source from `like` (a cluster of the
    same provider in the file) when there is one, else the `fatpipe init` template's."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"--write: {name!r} is not a cluster name (a-z, 0-9 and -, from a letter)")
    if provider not in MACHINE_KEY:
        raise ConfigError(f"--write: the chosen row is not a catalog machine ({provider})")
    region = like.region if like is not None else DEFAULT_REGION[provider]
    key = like.ssh_public_key if like is not None else "~/.ssh/id_ed25519.pub"
    cidr = like.ssh_cidr if like is not None else "203.0.113.7/32"
    lines = [
        f"[clusters.{name}]  # written by `fatpipe plan --write`",
        f"provider = {json.dumps(provider)}",
        f"region = {json.dumps(region)}",
        f"nodes = {int(nodes)}",
        f"tier = {json.dumps(tier)}",
        f"{MACHINE_KEY[provider]} = {json.dumps(machine)}",
        f"gpus_per_node = {int(gpus)}",
        f"ssh_public_key = {json.dumps(key)}",
        f"ssh_cidr = {json.dumps(cidr)}" + ("" if like is not None else "  # put your own address here"),
    ]
    return "\n".join(lines) + "\n"


def add_cluster(project, name: str, block: str) -> Path:
    """Append `block` to the project's cluster file once the whole new file validates."""
    if project.path is None:
        raise ConfigError("--write: no fatpipe.toml here to add to (`fatpipe init` makes one)")
    if name in project.clusters:
        raise ConfigError(f"--write: {project.label} already declares a cluster {name!r}")
    text = project.path.read_text()
    new = text.rstrip("\n") + "\n\n" + block
    parse_project(new, f"{project.label} with [clusters.{name}]")  # refused: nothing written
    return write_atomic(project.path, new, mode=project.path.stat().st_mode & 0o777)
