"""Heavy optional packages, imported on first use: the one place an operator module (infra, stacks,
ops, cli) defers an import to a function (docs/ARCHITECTURE.md, "Imports at the top").

Every other import sits at the top of its module, so the import graph is the code's graph. torch,
CDK for Terraform (cdktf or cdktn, constructs and the jsii runtime under them), boto3/botocore,
torchft, matplotlib, numpy and the tokenizers each take from a tenth of a second to seconds to
import; `fatpipe --help` and every command that needs none of them must not pay that. A fatpipe
module whose top imports one of them (a stack's construct, the CDK app) is loaded the same way,
by name, and the architecture test reads that name as the caller's import.

One helper over `importlib.import_module` rather than a function per package: the caller names
what it loads in the call (`load("botocore.exceptions").ClientError`), the allow-list below is
the whole policy, and a static scan finds every deferred edge by the string.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Third-party packages too heavy (or too optional) for a command's import path.
HEAVY = frozenset({
    "torch", "torchft", "numpy", "matplotlib", "tensorboard",
    "cdktf", "cdktn", "constructs", "jsii", "cdktf_cdktf_provider_aws", "cdktn_provider_aws",
    "boto3", "botocore", "tokenizers", "tiktoken",
})


def load(name: str) -> ModuleType:
    """The module `name`, imported now: a HEAVY package or a fatpipe module that imports one at its top."""
    if name.split(".")[0] not in HEAVY and not name.startswith("fatpipe."):
        raise ValueError(f"{name} is no heavy optional package: import it at the top of the module")
    return importlib.import_module(name)


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend: PNG files, no display."""
    load("matplotlib").use("Agg")
    return load("matplotlib.pyplot")
