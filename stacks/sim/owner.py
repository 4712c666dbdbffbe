"""Whose sim node is it: the project id a namespace carries, and the one check deploy and down share.

A sim node's names come from its cluster's name alone, so two project folders with a `demo`
cluster name the same namespaces. Each namespace carries its project's id as the alias of its
loopback device (the marker lives and dies with the namespace), and the node's folder records it
too. `node_up` (deploy) takes over a namespace only when `owns` says it is this project's;
`node_down` and `sweep_cluster` (down) remove one only then.
"""

from __future__ import annotations

import json
from pathlib import Path

from .links import run

OWNER_FILE = "owner.json"  # in the node's folder, written before its namespace is made
ALIAS_PREFIX = "fatpipe:"
IFALIAS_MAX = 255


def netns_owner(netns: str) -> str:
    """What the namespace's own marker says: "<project id> <folder>", or "" when it has none."""
    proc = run(["ip", "-n", netns, "-j", "link", "show", "dev", "lo"], check=False)
    try:
        alias = json.loads(proc.stdout)[0].get("ifalias", "") if proc.returncode == 0 else ""
    except (ValueError, IndexError, AttributeError):
        alias = ""
    return alias[len(ALIAS_PREFIX):] if alias.startswith(ALIAS_PREFIX) else ""


def folder_owner(node_dir: Path) -> str | None:
    """The project id the node's folder records; "" for a folder from before ids were recorded;
    None without a folder."""
    if not Path(node_dir).is_dir():
        return None
    for name in (OWNER_FILE, "ready.json"):
        try:
            doc = json.loads((Path(node_dir) / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("project_id"):
            return str(doc["project_id"])
    return ""


def owns(netns: str, node_dir: Path, project_id: str | None) -> bool:
    """Whether namespace `netns` is this project's node: its marker says so, else its folder does."""
    marker = netns_owner(netns).split(" ", 1)[0]
    if marker:
        return marker == project_id
    # No marker: made by an older fatpipe (its folder tells), cut short between `ip netns add`
    # and the marker (the owner record was written first), or not fatpipe's at all (no folder).
    found = folder_owner(node_dir)
    return found is not None and found in ("", project_id)


def describe_owner(netns: str) -> str:
    """Whose the namespace is, for a refusal: the project and its folder where the marker says."""
    marker = netns_owner(netns)
    if not marker:
        return "made outside fatpipe, or by a project folder that is gone"
    project_id, _, folder = marker.partition(" ")
    return f"it belongs to project {project_id}" + (f" in {folder}" if folder else "")


def mark_owner(netns: str, project_id: str | None) -> None:
    """Write the marker: the id first, then the project folder (the working folder) as far as it fits."""
    alias = f"{ALIAS_PREFIX}{project_id} {Path.cwd()}"[:IFALIAS_MAX]
    run(["ip", "-n", netns, "link", "set", "dev", "lo", "alias", alias])
