"""The link check step `netcheck` and `up` share: measure the links, print their tables (also when
the gate fails). Apart from the run steps (cli/steps.py) so `netcheck` imports no launch machinery.
"""

from __future__ import annotations

from fatpipe.ops.net.check import NetcheckFailed
from fatpipe.ops.net.check import run_netcheck as measure

from .render import netcheck_tables, note


def netcheck_step(cluster, options, out, run_dir=None, sink=None, remote_python=None):
    """Run the link check, print its tables (also when the gate fails) and where it wrote them."""
    try:  # its first call to each node reads the firewall too (ops.net.check.launch_netbench)
        doc = measure(cluster.logging(note(out)), run_dir=run_dir, options=options, sink=sink,
                      remote_python=remote_python)
    except NetcheckFailed as e:
        netcheck_tables(e.doc, out)
        raise
    netcheck_tables(doc, out)
    return doc
