"""fatpipe's built-in trainer: a byte-level GPT trained with DDP under torchrun.

It measures the link it trains over (gradient sync time, wire bytes, NIC throughput) and, with
comm = "auto", picks the DDP comm hook that link can afford. Entry point:
`python -m fatpipe.trainer`. This package imports nothing else of fatpipe but the node's
environment (`fatpipe.node.env`), shipped beside it.
"""
