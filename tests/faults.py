"""Fault injection on a deployed netns sim cluster, for tests: kill a node's trainer worker or its
torchrun agent, take its link down for a while, change its link rate.

A sim node is a network namespace on this machine (`fp-<cluster>-<index>`); what runs on it is
what `ip netns pids` lists there. Every call is bounded: nothing here waits without a timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

NODE_IFACE = "eth0"  # the node's end of its veth (fatpipe.stacks.simlinks.NODE_IFACE)
AGENT_MODULE = "torch.distributed.run"
CMD_TIMEOUT_S = 10


def netns_name(cluster: str, index: int) -> str:
    return f"fp-{cluster}-{index}"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)


def netns_pids(ns: str) -> list[int]:
    """The processes running in namespace `ns`."""
    return [int(p) for p in _ip("netns", "pids", ns).stdout.split()]


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def agents(ns: str) -> list[int]:
    """The torchrun agents running on the node."""
    return [p for p in netns_pids(ns) if AGENT_MODULE in cmdline(p)]


def workers(ns: str, module: str = "fatpipe.trainer") -> list[int]:
    """The node's worker processes: those running `module` that are not torchrun itself."""
    return [p for p in netns_pids(ns)
            if module in cmdline(p) and AGENT_MODULE not in cmdline(p)]


def wait_for(what: str, check: Callable[[], object], timeout_s: float, every_s: float = 0.1):
    """Poll `check` until it returns something true; that value, or AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def kill_worker(ns: str, rank: int | None = None, sig: int = signal.SIGKILL,
                timeout_s: float = 60) -> int:
    """Send `sig` (default SIGKILL) to one trainer worker on the node (global `rank` if given);
    returns its pid."""
    def pick() -> int | None:
        for pid in workers(ns):
            if rank is None or environ(pid).get("RANK") == str(rank):
                return pid
        return None

    pid = wait_for(f"a worker on {ns}", pick, timeout_s)
    os.kill(pid, sig)
    return pid


def kill_agent(ns: str, sig: int = signal.SIGKILL, timeout_s: float = 60) -> int:
    """Send `sig` (default SIGKILL) to the node's torchrun agent; returns its pid."""
    pid = wait_for(f"torchrun on {ns}", lambda: next(iter(agents(ns)), None), timeout_s)
    os.kill(pid, sig)
    return pid


def set_link(ns: str, up: bool) -> None:
    done = _ip("-n", ns, "link", "set", NODE_IFACE, "up" if up else "down")
    if done.returncode != 0:
        raise RuntimeError(f"ip -n {ns} link set {NODE_IFACE}: {done.stderr.strip()}")


def link_down(ns: str, seconds: float) -> None:
    """Take the node's link down for `seconds`, then up again (blocks that long)."""
    set_link(ns, up=False)
    try:
        time.sleep(seconds)
    finally:
        set_link(ns, up=True)


def link_down_later(ns: str, seconds: float) -> threading.Thread:
    """link_down in a daemon thread; join it (with a timeout) to know the link is back."""
    thread = threading.Thread(target=link_down, args=(ns, seconds), daemon=True,
                              name=f"link-down-{ns}")
    thread.start()
    return thread


def reshape(cluster: str, index: int, rate_gbit: float) -> None:
    """Set node `index`'s link rate (both directions), as a slow or congested node."""
    from fatpipe.stacks.simnet import reshape_node

    reshape_node(cluster, index, rate_gbit)
