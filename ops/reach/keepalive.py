"""How long ssh holds a quiet connection: it probes every ALIVE_S seconds and gives the connection
up after ALIVE_COUNT unanswered probes (a minute), so a follow's stream of a node behind a dead
link ends and is opened again. $FATPIPE_SSH_ALIVE_S sets the interval."""

from __future__ import annotations

import os

from fatpipe.infra.errors import FatpipeError

ALIVE_ENV, ALIVE_S, ALIVE_COUNT = "FATPIPE_SSH_ALIVE_S", 15, 4


def alive_interval_s() -> int:
    """ssh's keep-alive interval: $FATPIPE_SSH_ALIVE_S (whole seconds, 1 to 600), else ALIVE_S."""
    raw = os.environ.get(ALIVE_ENV, "").strip()
    if not raw:
        return ALIVE_S
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 600:
        raise FatpipeError(f"{ALIVE_ENV} must be a whole number of seconds from 1 to 600, not {raw!r}")
    return int(raw)


def alive_options() -> list[str]:
    """ssh's options for it."""
    return ["-o", f"ServerAliveInterval={alive_interval_s()}", "-o", f"ServerAliveCountMax={ALIVE_COUNT}"]
