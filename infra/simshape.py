"""Reshape one sim node's link after deploy (tc tbf, both ends): how tests and benchmarks make a slow node.

The sim provider shapes every link to the tier when a node comes up (infra/simnet.py); this
only replaces those qdiscs in place, so `fatpipe down` removes the node as usual.
"""

from __future__ import annotations

import subprocess

from .errors import FatpipeError


def shape_sim_node(cluster: str, index: int, rate_gbit: float) -> None:
    """Set node `index` of sim cluster `cluster` to `rate_gbit`, in both directions."""
    from .simnet import NODE_IFACE, link_names, tbf_args

    names = link_names(cluster, index)
    # The host end's egress is the node's ingress; the namespace end's egress is its egress.
    for prefix, dev in ((["tc"], names["host_if"]), (["tc", "-n", names["netns"]], NODE_IFACE)):
        argv = prefix + ["qdisc", "replace", "dev", dev, "root"] + tbf_args(rate_gbit)
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise FatpipeError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
