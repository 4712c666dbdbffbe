"""On a node, in the run's interpreter: its Python, torch, CUDA/NCCL, numpy and torchft versions, without importing
torch.

Standard library only, Python 3.8. `python -c` runs this file (the node program's `env` step,
ops/env/nodeenv.py) and it prints MARK and one JSON object. Importing torch costs seconds and
hundreds of MB on every node at every launch, so nothing is imported: the package is found where
the interpreter would import it from (`importlib.util.find_spec` runs no package code) and its
version read from the distribution installed beside it, else from its `version.py` or
`__init__.py` as text. CUDA is the torch build's (`torch/version.py`); NCCL the version of the
`nvidia-nccl-*` wheel the torch build requires, as installed. A torch that is there but does not
import is named by the run itself (ops/run/failure.py, from torchrun's own import of it).
"""

import ast
import importlib.util
import json
import os
import platform
import re
import sys
from importlib import metadata

MARK = "FATPIPE_ENV "


def assigned(path, name):
    """The literal assigned to `name` at the top of the Python file `path` (None: not there)."""
    try:
        with open(path, errors="replace") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def distribution(name, folder):
    """The installed distribution `name` in the sys.path entry `folder`, else None."""
    for dist in metadata.distributions(path=[folder]):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") == name:
            return dist
    return None


def package(name):
    """(version, package folder, its distribution) of what `import name` would find; None when absent."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return None
    folder = os.path.dirname(spec.origin)
    dist = distribution(name, os.path.dirname(folder))
    version = dist.version if dist else (assigned(os.path.join(folder, "version.py"), "__version__")
                                         or assigned(spec.origin, "__version__"))
    return version, folder, dist


def nccl(dist):
    """The NCCL wheel's version a torch build requires (installed, else as pinned), or None."""
    for requirement in (dist.requires or []) if dist else []:
        found = re.match(r"\s*(nvidia-nccl-[\w-]+)\s*(?:==\s*([\w.]+))?", requirement)
        if found:
            try:
                return metadata.version(found.group(1))
            except metadata.PackageNotFoundError:
                return found.group(2)
    return None


def report():
    r = {"python": platform.python_version(), "machine": platform.machine()}
    torch, numpy, torchft = package("torch"), package("numpy"), package("torchft")
    r["torch"] = torch[0] if torch else None
    r["cuda"] = assigned(os.path.join(torch[1], "version.py"), "cuda") if torch else None
    r["nccl"] = nccl(torch[2]) if torch else None
    r["numpy"] = numpy[0] if numpy else None
    r["torchft"] = torchft[0] if torchft else None
    if torch is None:
        r["error"] = f"no torch for {sys.executable}"
    return r


if __name__ == "__main__":
    print(MARK + json.dumps(report()), flush=True)
