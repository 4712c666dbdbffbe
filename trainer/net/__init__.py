"""The node side of `fatpipe netcheck`: the all-reduce sweep, node pairs, point-to-point rates."""
