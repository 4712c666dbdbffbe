"""The host firewall of a machine fatpipe did not make (docs/ARCHITECTURE.md, "The node firewall").

torchrun's c10d store listens on every interface and torch's rendezvous unpickles what it reads
there, so whoever reaches the rendezvous port runs code on every node; torchft's Lighthouse and
Manager stop a replica on request, its checkpoint server hands out the weights. On `ssh` clusters
the node agent installs an input filter of fatpipe's own: loopback, established traffic and the
nodes themselves (`members`) reach everything; a declared private network (`trusted`) every port but
the run's (`run_ports` and the node's ephemeral range, where gloo, NCCL and torchft's Manager and
checkpoint server listen); the rest of the world only the SSH port. nftables gets a table of its own
(`table inet fatpipe`, replaced atomically); where `nft` is missing, iptables/ip6tables get a chain
of their own (FATPIPE-INPUT, jumped to first from INPUT). Nothing else is touched: removing that
table or chain hands the ruleset back as it was.

Sent to the node beside `applier.py` (ops/reach/profile.py) and run there as root: standard library
only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

TABLE = "fatpipe"  # nft: `table inet fatpipe`
CHAIN = "FATPIPE-INPUT"  # iptables: jumped to from INPUT
SBIN = "/usr/local/sbin:/usr/sbin:/sbin"  # where nft/iptables live, off a non-root PATH
MEMBERS_COMMENT = "fatpipe: the nodes"  # names the nodes' rule for whoever lists the ruleset


def which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{SBIN}")


def run(argv: list[str], text: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=text, capture_output=True, text=True, timeout=60)


def checked(argv: list[str], text: str | None = None) -> str:
    proc = run(argv, text)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} {' '.join(argv[1:4])}: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout


def nft_ruleset(trusted: list[str], ssh_ports: list[int], members: list[str] | None = None,
                guarded: list[list[int]] | None = None) -> str:
    """fatpipe's table: policy drop; loopback, established, the `members`, the SSH ports, ICMP;
    the `guarded` port ranges closed to anyone else; then the `trusted` sources."""
    ports = ", ".join(str(p) for p in sorted(set(ssh_ports)))
    others = [source for source in trusted if source not in (members or [])]
    ranges = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in merged(guarded or []))
    return (
        f"table inet {TABLE} {{\n"
        "\tchain input {\n"
        "\t\ttype filter hook input priority 0; policy drop;\n"
        '\t\tiif "lo" accept\n'
        "\t\tct state established,related accept\n"
        + saddr_rules(members or [], MEMBERS_COMMENT) +
        f"\t\ttcp dport {{ {ports} }} accept\n"
        "\t\tmeta l4proto { icmp, ipv6-icmp } accept\n"
        + (f"\t\ttcp dport {{ {ranges} }} drop\n\t\tudp dport {{ {ranges} }} drop\n" if others and ranges else "")
        + saddr_rules(others) +
        "\t}\n"
        "}\n"
    )


def saddr_rules(sources: list[str], comment: str = "") -> str:
    """nft rules accepting `sources`, one per family."""
    v4 = ", ".join(source for source in sources if not is_v6(source))
    v6 = ", ".join(source for source in sources if is_v6(source))
    tail = f' comment "{comment}"' if comment else ""
    return (f"\t\tip saddr {{ {v4} }} accept{tail}\n" if v4 else "") + \
        (f"\t\tip6 saddr {{ {v6} }} accept{tail}\n" if v6 else "")


def merged(ranges: list[list[int]]) -> list[list[int]]:
    """Port ranges [first, last], sorted and overlapping ones joined (an nft set refuses overlaps)."""
    out: list[list[int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return out


def ephemeral_ports() -> list[int]:
    """The node's ephemeral range, where a server bound to port 0 listens; unreadable: every
    unprivileged port, to be safe."""
    try:
        first, last = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return [int(first), int(last)]
    except (OSError, ValueError):
        return [1024, 65535]


def guarded_ports(plan: dict) -> list[list[int]]:
    """The port ranges only the members reach: the run's and the ephemeral range (a plan from
    before `members` existed guards none: its trusted sources reach everything)."""
    return merged([plan["run_ports"], ephemeral_ports()]) if plan.get("members") else []


def is_v6(source: str) -> bool:
    return ":" in source


def iptables_rules(trusted: list[str], ssh_ports: list[int], v6: bool, members: list[str] | None = None,
                   guarded: list[list[int]] | None = None) -> list[list[str]]:
    """FATPIPE-INPUT's rules for iptables (v4) or ip6tables (v6), each with its family's sources,
    in nft_ruleset's order."""
    mine = [source for source in members or [] if is_v6(source) == v6]
    others = [source for source in trusted if is_v6(source) == v6 and source not in (members or [])]
    rules = [["-i", "lo", "-j", "ACCEPT"],
             ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]]
    rules += [["-s", source, "-j", "ACCEPT"] for source in mine]
    rules += [["-p", "tcp", "--dport", str(port), "-j", "ACCEPT"] for port in sorted(set(ssh_ports))]
    rules += [["-p", "ipv6-icmp" if v6 else "icmp", "-j", "ACCEPT"]]
    if others:
        rules += [["-p", proto, "--dport", f"{a}:{b}", "-j", "DROP"]
                  for a, b in merged(guarded or []) for proto in ("tcp", "udp")]
    rules += [["-s", source, "-j", "ACCEPT"] for source in others]
    return rules + [["-j", "DROP"]]


def backend() -> str | None:
    """nft where it exists, else iptables; None where the machine has neither."""
    if which("nft"):
        return "nft"
    return "iptables" if which("iptables") else None


def iptables_families() -> list[tuple[str, bool]]:
    """(binary, is IPv6) for iptables and, where present, ip6tables."""
    found = [(which("iptables"), False), (which("ip6tables"), True)]
    return [(path, v6) for path, v6 in found if path]


def snapshot() -> dict | None:
    """The ruleset as it is now, in the form the backend lists it (recorded before any change);
    None where there is no backend or it cannot list (a container without netfilter rights)."""
    tool = backend()
    if tool == "nft":
        listed = run([which("nft"), "list", "ruleset"])
        return {"tool": "nft", "ruleset": listed.stdout} if listed.returncode == 0 else None
    if tool == "iptables":
        saves = {"v6" if v6 else "v4": run([f"{path}-save"]).stdout for path, v6 in iptables_families()}
        return {"tool": "iptables", "saves": saves}
    return None


def apply(plan: dict, ssh_ports: list[int]) -> str:
    """Install fatpipe's filter (replacing an earlier one); returns the backend used."""
    tool = backend()
    if tool is None:
        raise RuntimeError("neither nft nor iptables is installed (Debian: apt-get install nftables)")
    if tool == "nft":
        # One transaction: make the table if absent, drop it, define it anew (never half there).
        text = f"add table inet {TABLE}\ndelete table inet {TABLE}\n" + nft_ruleset(
            plan["trusted"], ssh_ports, plan.get("members"), guarded_ports(plan))
        checked([which("nft"), "-f", "-"], text)
        return tool
    for path, v6 in iptables_families():
        if run([path, "-w", "-n", "-L", CHAIN]).returncode != 0:
            checked([path, "-w", "-N", CHAIN])
        checked([path, "-w", "-F", CHAIN])
        for rule in iptables_rules(plan["trusted"], ssh_ports, v6, plan.get("members"), guarded_ports(plan)):
            checked([path, "-w", "-A", CHAIN, *rule])
        if run([path, "-w", "-C", "INPUT", "-j", CHAIN]).returncode != 0:  # the chain is full before the jump
            checked([path, "-w", "-I", "INPUT", "1", "-j", CHAIN])
    return tool


def remove() -> None:
    """Take out fatpipe's table or chain, wherever one is; nothing else."""
    if which("nft") and run([which("nft"), "list", "table", "inet", TABLE]).returncode == 0:
        checked([which("nft"), "delete", "table", "inet", TABLE])
    if which("nft"):
        return
    for path, _ in iptables_families():
        while run([path, "-w", "-C", "INPUT", "-j", CHAIN]).returncode == 0:
            checked([path, "-w", "-D", "INPUT", "-j", CHAIN])
        if run([path, "-w", "-n", "-L", CHAIN]).returncode == 0:
            checked([path, "-w", "-F", CHAIN])
            checked([path, "-w", "-X", CHAIN])


def revert(recorded: dict | None) -> bool | None:
    """Remove fatpipe's filter; whether the ruleset now equals the recorded one (None: none recorded)."""
    remove()
    if not recorded:
        return None
    now = snapshot()
    if now is None or now["tool"] != recorded["tool"]:
        return False
    if now["tool"] == "nft":
        return now["ruleset"] == recorded["ruleset"]
    return all(same_saves(now["saves"].get(k, ""), recorded["saves"].get(k, ""))
               for k in {*now["saves"], *recorded["saves"]})


def same_saves(a: str, b: str) -> bool:
    """iptables-save texts equal but for comments, counters and an empty table the kernel keeps
    once a rule was added (built-in chains with policy ACCEPT and no rules)."""
    return normal_save(a) == normal_save(b)


def normal_save(text: str) -> list[str]:
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        line = re.sub(r" \[\d+:\d+\]$", "", line)
        current.append(line)
        if line == "COMMIT":
            empty = all(re.fullmatch(r":[A-Z]+ ACCEPT", x) for x in current[1:-1])
            if not empty:
                tables.extend(current)
            current = []
    return tables
