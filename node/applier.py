"""The node profile's applier, run on a machine fatpipe did not create (`ssh` clusters): apply, revert.

Sent over SSH as a program (`python3 - apply|revert` as root) that loads this file and
`hostfirewall.py` as modules, sets `PROFILE` and calls `main()` (`ops.reach.profile.agent_program`):
the files, sysctls and packages that cloud-init gets on clouds, from the same renderer
(`fatpipe.stacks.node_profile.profile_plan`). It needs Python's standard library alone. Everything
it changes is recorded first in `/var/lib/fatpipe/restore.json` (original sysctl values, MTU, files
it replaced), so `revert` hands the machine back as it was. On `ssh` clusters it also installs
fatpipe's host firewall (`hostfirewall.py`, sent beside this program): the ruleset is recorded with
the rest, and `revert` takes out fatpipe's table or chain only, which hands the recorded ruleset
back.

With $FATPIPE_ROOT set (a sim node that shares its host's filesystem), files go below that
folder, and nothing host-wide is touched: no apt, no kernel modules, no systemd.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

try:  # on the node: sent beside this program as a module of its own (ops/reach/profile.py)
    import hostfirewall as firewall
except ImportError:  # imported from the project
    from fatpipe.node import hostfirewall as firewall

ROOT = os.environ.get("FATPIPE_ROOT", "")
SANDBOX = bool(ROOT)
STATE = Path(f"{ROOT}/var/lib/fatpipe")
RESTORE = STATE / "restore.json"
APPLIED = STATE / "sysctl-apply.json"  # what the kernel took; the ready marker carries it
ENV_KEYS = ("NCCL_SOCKET_IFNAME=", "GLOO_SOCKET_IFNAME=")  # lines the net script adds


def run(argv: list[str], check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:3])} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc


def proc_sys(name: str) -> Path:
    return Path("/proc/sys", *name.split("."))


def read_sysctl(name: str) -> str | None:
    try:
        return " ".join(proc_sys(name).read_text().split())
    except OSError:
        return None


def private_iface(private_ip: str) -> tuple[str | None, int | None]:
    """(name, MTU) of the interface holding `private_ip`."""
    out = run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"
    for link in json.loads(out):
        for addr in link.get("addr_info", []):
            if ipaddress.ip_address(addr["local"]) == ipaddress.ip_address(private_ip):
                return link["ifname"], link.get("mtu")
    return None, None


def record_original(profile: dict) -> dict:
    """What the machine had before the first apply; a later apply keeps the first record."""
    if RESTORE.exists():
        return json.loads(RESTORE.read_text())
    iface, mtu = private_iface(profile["private_ip"])
    replaced = {}
    for path in profile["files"]:
        target = Path(f"{ROOT}{path}")
        if target.is_file():
            replaced[path] = base64.b64encode(target.read_bytes()).decode()
    record = {"sysctls": {n: read_sysctl(n) for n in profile["sysctls"]},
              "iface": iface, "mtu": mtu, "replaced": replaced, "files": list(profile["files"]),
              "firewall": firewall.snapshot()}
    STATE.mkdir(parents=True, exist_ok=True)
    RESTORE.write_text(json.dumps(record, indent=1) + "\n")
    return record


def write_files(files: dict) -> None:
    for path, spec in files.items():
        target = Path(f"{ROOT}{path}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".fatpipe-tmp")
        tmp.write_text(spec["content"])
        os.chmod(tmp, int(spec["mode"], 8))
        os.replace(tmp, target)


def apply_sysctls(wanted: dict) -> dict:
    """Write each sysctl into /proc/sys; report what the kernel refused or does not have here
    (a network namespace or a container VPS namespaces only some)."""
    result: dict = {"applied": [], "refused": {}, "absent": []}
    for name, value in wanted.items():
        path = proc_sys(name)
        if not path.exists():
            result["absent"].append(name)
            continue
        try:
            path.write_text(value)
            result["applied"].append(name)
        except OSError as e:
            result["refused"][name] = e.strerror or str(e)
    APPLIED.write_text(json.dumps(result, indent=1) + "\n")
    return result


def install_packages(packages: list[str]) -> None:
    missing = [p for p in packages if run(["dpkg", "-s", p]).returncode != 0]
    if not missing or not shutil.which("apt-get"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env)
        if proc.returncode != 0:  # the ready marker records what is missing; `wait` names it
            print(f"fatpipe: {' '.join(argv[:2])} failed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
            return


def ssh_ports(declared: int | None) -> list[int]:
    """The port the node is reached on: as declared, and as this session came in ($SSH_CONNECTION
    of this process or the nearest ancestor holding it: sudo resets the environment)."""
    ports, pid = {declared} if declared else set(), os.getpid()
    for _ in range(16):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found = [e.split(b"=", 1)[1].split() for e in env if e.startswith(b"SSH_CONNECTION=")]
        if found and len(found[0]) == 4 and found[0][3].isdigit():
            ports.add(int(found[0][3]))
            break
    return sorted(ports) or [22]


def apply_firewall(profile: dict) -> str:
    """fatpipe's host firewall as the profile asks (none: an opt-out, so any earlier one goes)."""
    plan = profile.get("firewall")
    if not plan:
        try:
            firewall.remove()  # an earlier one of fatpipe's, if any
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            print(f"fatpipe: an earlier firewall of fatpipe's could not be removed: {e}", file=sys.stderr)
        return "off"
    try:
        return firewall.apply(plan, ssh_ports(profile.get("ssh_port")))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        sys.exit(f"the host firewall could not be installed: {e} (firewall = false opts out, leaving "
                 "the rendezvous and training ports open to whoever reaches the machine)")


def apply(profile: dict) -> None:
    record_original(profile)
    guarded = apply_firewall(profile)  # first: the node is closed before anything listens
    write_files(profile["files"])
    if not SANDBOX:
        for module in ("tcp_bbr", "sch_fq"):  # before the sysctls that need them
            run(["modprobe", module])
    result = apply_sysctls(profile["sysctls"])
    if profile.get("packages") and not SANDBOX:
        install_packages(profile["packages"])
    systemd = Path("/run/systemd/system").is_dir() and not SANDBOX
    if systemd:  # the unit sets MTU and the NCCL/gloo interface again at every boot
        run(["systemctl", "daemon-reload"])
        run(["systemctl", "enable", "--now", profile["unit"]], check=True)
    else:
        run([f"{ROOT}{profile['net_script']}"], check=True)
    run([sys.executable, f"{ROOT}{profile['ready_script']}"], check=True)
    refused = sorted(result["refused"]) + sorted(result["absent"])
    print(json.dumps({"applied": len(result["applied"]), "not_applied": refused, "firewall": guarded}))


def revert(profile: dict) -> None:
    if not RESTORE.exists():
        try:
            firewall.remove()  # only fatpipe's own table or chain, should one be left
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            print(f"fatpipe: the firewall could not be removed: {e}", file=sys.stderr)
        print(json.dumps({"reverted": False}))  # never applied, or already reverted
        return
    record = json.loads(RESTORE.read_text())
    try:
        restored = firewall.revert(record.get("firewall"))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:  # the rest is still handed back
        print(f"fatpipe: the firewall could not be removed: {e}", file=sys.stderr)
        restored = False
    for name, value in record["sysctls"].items():
        if value is not None and proc_sys(name).exists():
            try:
                proc_sys(name).write_text(value)
            except OSError:
                pass  # refused when applied too
    if record.get("iface") and record.get("mtu"):
        run(["ip", "link", "set", "dev", record["iface"], "mtu", str(record["mtu"])])
    if Path("/run/systemd/system").is_dir() and not SANDBOX:
        run(["systemctl", "disable", "--now", profile["unit"]])
    for path in record["files"]:
        target = Path(f"{ROOT}{path}")
        if path in record["replaced"]:
            target.write_bytes(base64.b64decode(record["replaced"][path]))
        else:
            target.unlink(missing_ok=True)
    environment = Path(f"{ROOT}/etc/environment")
    if environment.exists():
        kept = [line for line in environment.read_text().splitlines(keepends=True) if not line.startswith(ENV_KEYS)]
        environment.write_text("".join(kept))
    for folder in (Path(f"{ROOT}/etc/fatpipe"), STATE):  # never the project folder: root removes nothing of a user's
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"reverted": True, "firewall_restored": restored}))


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("fatpipe: the node profile needs root (run as root, or give the login passwordless sudo)")
    action = sys.argv[1] if len(sys.argv) > 1 else ""
    if action not in ("apply", "revert"):
        sys.exit("usage: python3 - apply|revert")
    {"apply": apply, "revert": revert}[action](PROFILE)  # noqa: F821 - appended when sent
