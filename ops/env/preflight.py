"""Before anything is paid for: is there a torch wheel for the cloud image's Python and architecture?

docs/ARCHITECTURE.md, "The node environment". Cloud nodes boot a known image (Ubuntu 24.04 on
AWS, the declared image on DigitalOcean), so their Python is known before they exist (the
provider says which: its `image_python`); the index is asked for the declared torch
(ops/env/wheelcheck.py) and the answer names the wheel, or what is missing, in one line. Where
nothing is paid for (`sim`, `vm`, and `ssh` machines rented already) the command does not ask:
the environment is checked on the nodes themselves before launch (ops/env/nodeenv.py).
"""

from __future__ import annotations

from fatpipe.infra.catalog import machine_for
from fatpipe.infra.nodevenv import node_venv

from ..reach.cluster import Cluster
from .wheelcheck import IndexUnreachable, torch_wheel

NOTHING_TO_PAY = "nothing to pay for: the nodes' environment is checked before launch"


def wheel_preflight(cluster: Cluster, python: str | None) -> str:
    """The wheel the command's cluster's nodes will install, in one line; `python` is the Python
    of the image they boot (None: not known to fatpipe).

    Raises FatpipeError naming the missing wheel (ops/env/wheelcheck.py); an index that does not
    answer (offline) is said in the line, and deploy goes on.
    """
    spec, project = cluster.spec, cluster.project
    if python is None:
        return f"torch wheel not checked: the Python of image {spec.image!r} is not known to fatpipe"
    machine = machine_for(spec, project.root).arch
    venv = node_venv(project, spec, spec.gpus_per_node)
    try:
        wheel = torch_wheel(venv, python, machine)
    except IndexUnreachable as e:  # offline here is no proof the nodes lack a wheel: say so, go on
        return f"torch wheel not checked: {e}"
    return f"torch wheel for Python {python} {machine}: {wheel} ({venv.index or 'PyPI'})"
