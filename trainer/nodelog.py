"""The trainer's logging on a node: its own lines and the libraries' apart.

Every line goes to the node's log. The libraries' (torchft's Manager, torch.distributed) carry
their logger's name in the prefix, `[trainer r0 | torchft.manager]`, so the operator's terminal can
leave them to the node log (`ops.run.nodelines`) while fatpipe's own lines, `[trainer r0]`, show.
"""

from __future__ import annotations

import logging
import sys

OWN_LOGGERS = ("fatpipe", "__main__")


class NodeLogFormat(logging.Formatter):
    """`[trainer rN] message` for fatpipe's loggers, `[trainer rN | logger] message` for others."""

    def __init__(self, rank: int):
        super().__init__("%(message)s")
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        own = record.name == "root" or record.name.startswith(OWN_LOGGERS)
        tag = f"trainer r{self.rank}" if own else f"trainer r{self.rank} | {record.name}"
        return f"[{tag}] {super().format(record)}"


def log_to_stderr(rank: int, level: int) -> None:
    """The trainer process's logging: every logger to stderr, the libraries' tagged."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(NodeLogFormat(rank))
    logging.basicConfig(level=level, handlers=[handler])
