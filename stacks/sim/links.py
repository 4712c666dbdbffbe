"""Linux plumbing of sim nodes: namespaces, veths on a bridge, tc tbf shaping, sysctls in a namespace."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.tiers import normalize_sysctl

NODE_IFACE = "eth0"  # the node's end of its veth, inside the namespace
LOCK_DIR = Path("/run/fatpipe")
KILL_GRACE_S = 5.0

# Run inside the namespace: apply each sysctl the kernel namespaces (its file exists under this
# namespace's /proc/sys), read every one back. argv[1] is {name: value} as JSON.
_SYSCTL_SCRIPT = r"""
import json, sys
want = json.loads(sys.argv[1]); out = {"values": {}, "namespaced": [], "absent": [], "failed": {}}
for name, value in want.items():
    path = "/proc/sys/" + name.replace(".", "/")
    try:
        open(path).close()
    except OSError:
        out["absent"].append(name); continue
    try:
        with open(path, "w") as f: f.write(value)
        out["namespaced"].append(name)
    except OSError as e:
        out["failed"][name] = e.strerror or str(e)
    with open(path) as f: out["values"][name] = " ".join(f.read().split())
print(json.dumps(out))
"""


def tbf_burst_bytes(rate_gbit: float) -> int:
    """About 4 ms of traffic at the rate (500 KB at 1 Gbit/s, 5 MB at 10), at least 64 KiB.

    The sustained rate is the tier either way (iperf3 reads 0.956 of 1 Gbit/s, the TCP ceiling).
    The bucket only lets a link catch up after a sender lost the CPU for a few ms: on a shared
    2-core machine that stall, not the link, held a 4-node gloo ring at 0.93 of the tier with
    a 1 ms bucket; with 4 ms it reaches 0.95, as separate machines would.
    """
    return max(int(rate_gbit * 1e9 / 8 / 250), 64 * 1024)


def tbf_args(rate_gbit: float) -> list[str]:
    return ["tbf", "rate", f"{int(rate_gbit * 1e9)}bit", "burst", str(tbf_burst_bytes(rate_gbit)),
            "latency", "20ms"]


def shape_link(netns: str, host_if: str, rate_gbit: float) -> None:
    """Shape a node's veth to `rate_gbit` (tc tbf) in both directions, replacing any qdisc there."""
    # The host end's egress is the node's ingress; the namespace end's egress is its egress.
    run(["tc", "qdisc", "replace", "dev", host_if, "root"] + tbf_args(rate_gbit))
    run(["tc", "-n", netns, "qdisc", "replace", "dev", NODE_IFACE, "root"] + tbf_args(rate_gbit))


def apply_sysctls(netns: str, wanted: dict[str, str]) -> dict:
    """Apply in the namespace what the kernel namespaces; report the host's value for the rest."""
    proc = run(["ip", "netns", "exec", netns, sys.executable, "-c", _SYSCTL_SCRIPT,
                 json.dumps(wanted)])
    result = json.loads(proc.stdout)
    values = result["values"]
    for name in result["absent"]:  # global: the host's value is the one sockets here get
        value = host_sysctl(name)
        if value is not None:
            values[name] = value
    return {
        "sysctls": values,
        "namespaced": result["namespaced"],
        "not_namespaced": result["absent"],
        "failed": result["failed"],  # namespaced but refused (e.g. above the host's limit)
    }


# --- small wrappers around ip / tc -----------------------------------------------------------


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one network command to its end: in a session of its own, so a Ctrl-C sent to fatpipe's
    process group (fatpipe handles it) cannot kill it half-way through a set-up or teardown."""
    proc = subprocess.run(argv, capture_output=True, text=True, start_new_session=True)
    if check and proc.returncode != 0:
        raise FatpipeError(f"`{' '.join(argv[:8])}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def host_sysctl(name: str) -> str | None:
    """The host's value of sysctl `name` (fields single-spaced), or None if it cannot be read."""
    try:
        return normalize_sysctl(Path("/proc/sys", *name.split(".")).read_text())
    except OSError:
        return None


def netns_list() -> list[str]:
    # `ip netns list` prints "name (id: N)"; the files under /run/netns are the names.
    with contextlib.suppress(FileNotFoundError):
        return sorted(os.listdir("/run/netns"))
    return []


def netns_exists(name: str) -> bool:
    return name in netns_list()


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def bridge_ports(bridge: str) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return os.listdir(f"/sys/class/net/{bridge}/brif")
    return []


def link_mtu(iface: str, netns: str | None = None) -> int:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "link", "show", iface]
    return int(json.loads(run(argv).stdout)[0]["mtu"])


def ensure_bridge(bridge: str) -> None:
    if link_exists(bridge):
        return
    run(["ip", "link", "add", bridge, "type", "bridge"])
    # With br_netfilter loaded, bridged frames would cross the host's iptables FORWARD chain
    # (DROP by default where Docker runs): keep the sim's traffic out of it.
    run(["ip", "link", "set", bridge, "type", "bridge", "nf_call_iptables", "0",
          "nf_call_ip6tables", "0", "nf_call_arptables", "0"], check=False)
    run(["ip", "link", "set", bridge, "up"])


@contextlib.contextmanager
def bridge_lock(bridge: str):
    """Nodes come up in parallel (terraform runs provisioners concurrently): one at a time here."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"{bridge}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def kill_netns_processes(netns: str, log) -> None:
    """TERM what still runs in the namespace (a training run, a benchmark), then KILL."""
    deadline = time.monotonic() + KILL_GRACE_S
    sig = signal.SIGTERM
    while time.monotonic() < deadline + 2:  # then give up: deleting the namespace still works
        pids = [int(p) for p in run(["ip", "netns", "pids", netns], check=False).stdout.split()]
        if not pids:
            return
        if sig == signal.SIGTERM:
            log(f"{netns}: stopping {len(pids)} process(es) still running there")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.1)
