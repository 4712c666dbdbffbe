"""Before anything is paid for: is there a torch wheel for the cloud image's Python and architecture?

docs/ARCHITECTURE.md, "The node environment". Cloud nodes boot a known image (Ubuntu 24.04 on
AWS, the declared image on DigitalOcean), so their Python is known before they exist; the index
is asked for the declared torch (ops/env/wheelcheck.py) and the answer names the wheel, or what is
missing, in one line. `sim` costs nothing and `ssh` machines are rented already: their
environment is checked on the nodes themselves before launch (ops/env/nodeenv.py).
"""

from __future__ import annotations

import re

from fatpipe.infra.catalog import machine_for
from fatpipe.infra.nodevenv import node_venv

from .wheelcheck import IndexUnreachable, torch_wheel

AWS_IMAGE_PYTHON = "3.12"  # the stacks' AMIs: Ubuntu 24.04 (plain, or the Deep Learning Base AMI)
UBUNTU_PYTHON = {"20-04": "3.8", "22-04": "3.10", "24-04": "3.12", "24-10": "3.12", "25-04": "3.13"}
UBUNTU_IMAGE = re.compile(r"^ubuntu-(\d\d-\d\d)-")
NOTHING_TO_PAY = "nothing to pay for: the nodes' environment is checked before launch"


def image_python(cluster) -> str | None:
    """The Python of the image the cluster's nodes boot, where fatpipe knows it."""
    if cluster.provider == "aws":
        return AWS_IMAGE_PYTHON
    found = UBUNTU_IMAGE.match(getattr(cluster, "image", "") or "")
    return UBUNTU_PYTHON.get(found.group(1)) if found else None


def wheel_preflight(project, cluster) -> str | None:
    """The wheel the cluster's nodes will install, in one line; None where nothing is paid for.

    Raises FatpipeError naming the missing wheel (ops/env/wheelcheck.py); an index that does not
    answer (offline) is said in the line, and deploy goes on.
    """
    if cluster.provider not in ("aws", "digitalocean"):
        return None
    python = image_python(cluster)
    if python is None:
        return f"torch wheel not checked: the Python of image {cluster.image!r} is not known to fatpipe"
    machine = machine_for(cluster, project.root).arch
    venv = node_venv(project, cluster.name, cluster.gpus_per_node)
    try:
        wheel = torch_wheel(venv, python, machine)
    except IndexUnreachable as e:  # offline here is no proof the nodes lack a wheel: say so, go on
        return f"torch wheel not checked: {e}"
    return f"torch wheel for Python {python} {machine}: {wheel} ({venv.index or 'PyPI'})"
