"""The base of every provider's cluster construct: its resources, and the `cluster` output value."""

from __future__ import annotations

from ..toolkit import Construct


class ClusterConstruct(Construct):
    """A cluster as one construct; a subclass builds its resources in `__init__`.

    It exposes what it builds as attributes (the nodes, the network) and `output`: the value
    of the stack's `cluster` output (docs/ARCHITECTURE.md, "The outputs contract"). Its
    resources keep their own ids as Terraform names (`aws_instance.nodes`): see
    `stacks.app.ClusterStack`.
    """

    output: dict
