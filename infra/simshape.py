"""Reshape one sim node's link after deploy (tc tbf, both ends): how tests and benchmarks make a slow node.

The sim provider shapes every link to the tier when a node comes up (infra/simnet.py); this
only replaces those qdiscs in place, so `fatpipe down` removes the node as usual.
"""

from __future__ import annotations


def shape_sim_node(cluster: str, index: int, rate_gbit: float) -> None:
    """Set node `index` of sim cluster `cluster` to `rate_gbit`, in both directions."""
    from .simnet import link_names, shape_link

    names = link_names(cluster, index)
    shape_link(names["netns"], names["host_if"], rate_gbit)
