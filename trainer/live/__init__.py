"""Live fault tolerance on torchft (`fault_tolerance = "live"`; docs/ARCHITECTURE.md, "Live fault
tolerance"): each node is one replica group, torchft's Manager forms a quorum of the groups
that are up at every step, a lost node is left out at the next step, and a returning one copies
the live weights from a peer instead of a checkpoint.

`lighthouse` runs torchft's Lighthouse on a private address; `manager` builds the Manager with
every server it starts bound to the node's private address; `epochs` gives it the quorum id it
acts on and `timeouts` a heal's timeouts; `step` is one commit-gated optimizer step;
`membership` reads joins, leaves and goodput from the steps' records.
"""
