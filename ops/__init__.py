"""Act on a deployed cluster: reach its nodes, wait for them, rendezvous, launch, netcheck."""
