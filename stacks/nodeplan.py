"""What an apply would do to the cluster's existing nodes, read from the engine's plan as JSON.

`terraform show -json PLANFILE` (tofu's is the same format) lists every resource change with its
actions. A node is replaced (`["delete", "create"]` or `["create", "delete"]`), destroyed
(`["delete"]`), or updated in place (`["update"]`), which on some attributes stops and starts
the machine (a run on it ends as surely). Each of those needs the user's yes
(docs/ARCHITECTURE.md, "The deploy plan"). A node that is gone (terminated, preempted) is not in
the refreshed state, so the plan only creates it: no question. Pure: no engine, no console.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from fatpipe.infra.errors import FatpipeError

# The resource types that are nodes, and how a resource's name and index become a node's name.
NODE_TYPES = ("aws_instance", "digitalocean_droplet", "terraform_data")
INDEXED_NAME = re.compile(r"(?:node|host)-(\d+)")  # the sim, vm and ssh stacks: one terraform_data each

# Attributes whose in-place update stops the machine and starts it again (the providers do so:
# hashicorp/aws for the type and user data, and for what EC2 modifies only on a stopped instance;
# digitalocean/digitalocean powers a droplet off to resize it).
STOP_START = {
    "aws_instance": ("instance_type", "user_data", "user_data_base64", "cpu_options", "cpu_core_count",
                     "cpu_threads_per_core", "capacity_reservation_specification", "ebs_optimized",
                     "enclave_options", "hibernation", "instance_market_options"),
    "digitalocean_droplet": ("size", "resize_disk", "image"),
}
SHOWN_VALUE = 32  # a longer value is named, not printed (user data, or its 40-digit hash in the state)


@dataclass(frozen=True)
class NodeChange:
    """One existing node the plan would replace, destroy, or stop and start."""

    node: str  # the node's name
    address: str  # the resource's address in the plan
    change: str  # "replace" | "destroy" | "stop and start"
    attributes: tuple[str, ...] = ()  # what forces it: changed attributes (with values when short)

    def describe(self) -> str:
        why = f" ({', '.join(self.attributes)})" if self.attributes else ""
        return f"{self.change}{why}"


def node_changes(plan: dict, node_name, spared: tuple[str, ...] = ()) -> list[NodeChange]:
    """Every change in `plan` (terraform's JSON plan) that ends a run on an existing node.

    `node_name(i)` names node i (the cluster's); `spared`: addresses fatpipe itself asked to
    replace because the node is gone (a sim namespace or a vm's QEMU that this machine lost).
    """
    found = []
    for rc in plan.get("resource_changes") or []:
        if rc.get("mode", "managed") != "managed" or rc.get("type") not in NODE_TYPES:
            continue
        name = _node_of(rc, node_name)
        if name is None or rc.get("address") in spared:
            continue
        change = rc.get("change") or {}
        actions = list(change.get("actions") or [])
        if "delete" in actions and "create" in actions:
            found.append(NodeChange(name, rc["address"], "replace", _replaced_by(rc)))
        elif actions == ["delete"]:
            found.append(NodeChange(name, rc["address"], "destroy", _deleted_because(rc)))
        elif actions == ["update"]:
            stopping = [a for a in _changed(change) if a in STOP_START.get(rc["type"], ())]
            if stopping:
                found.append(NodeChange(name, rc["address"], "stop and start",
                                        tuple(_with_values(change, a) for a in stopping)))
    return found


def _node_of(rc: dict, node_name) -> str | None:
    """The node a resource change is about: a for_each key is the node's name; a terraform_data
    `node-<i>`/`host-<i>` is node i; anything else (a VPC, a firewall) is no node."""
    if rc["type"] == "terraform_data":
        matched = INDEXED_NAME.fullmatch(str(rc.get("name", "")))
        return node_name(int(matched.group(1))) if matched else None
    index = rc.get("index")
    if isinstance(index, str):
        return index
    if isinstance(index, int):
        return node_name(index)
    return str(rc.get("name", rc.get("address")))


def _changed(change: dict) -> list[str]:
    """Top-level attributes whose value differs, or becomes known only after the apply."""
    before, after = change.get("before") or {}, change.get("after") or {}
    unknown = change.get("after_unknown") or {}
    keys = sorted(set(before) | set(after) | set(unknown))
    return [k for k in keys if before.get(k) != after.get(k) or unknown.get(k) is True]


def _replaced_by(rc: dict) -> tuple[str, ...]:
    change = rc.get("change") or {}
    names = list(dict.fromkeys(str(path[0]) for path in change.get("replace_paths") or [] if path))
    if names:
        return tuple(shown for name in names for shown in _named(change, name))
    reason = rc.get("action_reason", "")
    return {"replace_by_request": ("asked for",), "replace_because_tainted": ("tainted",)}.get(reason, ())


def _deleted_because(rc: dict) -> tuple[str, ...]:
    reason = rc.get("action_reason", "")
    if reason.startswith("delete_because_"):  # no_resource_config, each_key, count_index, ...
        return ("no longer declared",)
    return ()


def _named(change: dict, name: str) -> list[str]:
    """`name` with its values; a map (terraform_data's triggers_replace) as its changed keys."""
    before, after = (change.get("before") or {}).get(name), (change.get("after") or {}).get(name)
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        inner = {"before": before, "after": after}
        return [_with_values(inner, k) for k in keys] or [name]
    return [_with_values(change, name)]


def _with_values(change: dict, name: str) -> str:
    """`name old -> new` when both are short scalars; else the name alone."""
    before, after = (change.get("before") or {}).get(name), (change.get("after") or {}).get(name)
    if (change.get("after_unknown") or {}).get(name) is True:
        after = "(known after apply)"
    shown = [v for v in (before, after) if isinstance(v, (str, int, float)) and len(str(v)) <= SHOWN_VALUE]
    return f"{name} {before} -> {after}" if len(shown) == 2 else name


def review(changes: list[NodeChange], cluster: str, approve: Callable[[list[NodeChange]], bool] | None) -> None:
    """Go on only when nothing ends a run on an existing node, or `approve` (the user) says yes."""
    if not changes or (approve is not None and approve(changes)):
        return
    kinds = ", ".join(dict.fromkeys(c.change for c in changes))
    nodes = ", ".join(dict.fromkeys(c.node for c in changes))
    raise FatpipeError(f"deploy of {cluster} stopped before the apply: it would {kinds} {nodes}; nothing was "
                       f"changed. `fatpipe deploy {cluster} --replace` goes on (what a node holds is lost "
                       "when it is replaced, and a stop ends its run)")
