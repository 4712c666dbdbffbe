"""Heavy or optional packages, imported on first use: the one place a trainer module defers an
import to a function (docs/ARCHITECTURE.md, "Imports at the top"). The trainer ships to the nodes
alone and imports nothing else of fatpipe, so it holds its own copy of the operator's
`fatpipe.infra.lazy`.

torch is the trainer's base, yet the operator imports the trainer's torch-free parts (the comm cost
model, the link probes' servers, staging) and a bad flag fails before torch loads; torchft
(fault_tolerance = "live", x86_64 only), tensorboard, numpy and boto3 (an s3 data source) are
optional on a node, and so is rich (a progress bar on a terminal). A trainer module whose top
imports one of them is loaded the same way, by name.
"""

from __future__ import annotations

import importlib
from types import ModuleType

HEAVY = frozenset({"torch", "torchft", "numpy", "tensorboard", "boto3", "botocore", "rich"})


def load(name: str) -> ModuleType:
    """The module `name`, imported now: a HEAVY package or a trainer module that imports one at its top."""
    if name.split(".")[0] not in HEAVY and not name.startswith("fatpipe.trainer."):
        raise ValueError(f"{name} is no heavy optional package: import it at the top of the module")
    return importlib.import_module(name)
