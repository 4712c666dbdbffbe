"""`up`'s and `deploy`'s preflight: the torch wheel the nodes will install, before anything is paid for."""

from __future__ import annotations


def wheel_phase(project, cluster, phases) -> None:
    """`up`'s wheels phase (ops/preflight.py); raises naming a missing wheel, so deploy never starts."""
    from fatpipe.ops.preflight import wheel_preflight

    wheel = phases.run("wheels", "a torch wheel for the nodes' Python, before anything is paid for",
                       lambda: wheel_preflight(project, cluster))
    phases.get("wheels").note = wheel or "nothing to pay for: the nodes' environment is checked before launch"
