"""Which SSH host keys a node must show (docs/ARCHITECTURE.md, "Host keys").

Three policies, by who made the machine:
- `pinned` (AWS): cloud-init prints the node's host keys to its console, which the provider's
  authenticated API reads back; they are written to the cluster's known_hosts before the first
  connection, and ssh accepts nothing else (StrictHostKeyChecking=yes).
- `user` (`ssh` clusters, machines fatpipe did not make): a host the user's own known_hosts
  files know is checked against those files alone, so a key the user verified is enforced;
  any other host is first-contact as below. Nothing is ever written to the user's files.
- `accept-new` (DigitalOcean, which has no such channel, and sim nodes): the first key offered
  is written to the cluster's known_hosts and a changed one is refused; deploy forgets the keys
  of the nodes it has just recreated.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from fatpipe.infra.clusters import model_of
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_atomic
from fatpipe.infra.outputs import read_outputs

SSH_CONFIG_ENV = "FATPIPE_SSH_CONFIG"  # an ssh_config file used instead of ~/.ssh/config (ssh -F)
CONSOLE_BLOCK = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S)
# A key line, after whatever prefix the console puts before it (a timestamp, "ec2: ").
KEY_LINE = re.compile(r"(?:^|\s)((?:ssh|ecdsa-sha2|sk-ssh|sk-ecdsa-sha2)-[A-Za-z0-9@.-]+) "
                      r"([A-Za-z0-9+/]{16,}={0,3})(?:\s|$)")
CONSOLE_WAIT_S = 300  # cloud-init prints the keys a minute or two after boot


def policy_for(provider: str) -> str:
    """The provider's host key policy (its cluster model's `host_keys`)."""
    model = model_of(provider)
    return model.host_keys if model is not None else "accept-new"


@functools.cache
def resolved(config: str | None, host: str, port: int | None) -> tuple[str, tuple[str, ...]]:
    """(the name ssh looks the host's key up under, the user's known_hosts files) as ssh itself
    resolves them from the ssh config (`ssh -G`: HostName, Port, HostKeyAlias, UserKnownHostsFile)."""
    argv = ["ssh", "-G", *(["-F", config] if config else []), *(["-p", str(port)] if port else []), "--", host]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        done = None
    conf = {}
    for line in done.stdout.splitlines() if done and done.returncode == 0 else []:
        key, _, value = line.partition(" ")
        conf.setdefault(key.lower(), value)
    name = conf.get("hostkeyalias") or conf.get("hostname") or host
    port_text = conf.get("port") or str(port or 22)
    lookup = name if port_text == "22" else f"[{name}]:{port_text}"
    files = conf.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2").split()
    return lookup, tuple(os.path.expanduser(f) for f in files)


def user_files_knowing(config: str | None, host: str, port: int | None) -> list[str]:
    """The user's own known_hosts files that hold a key for the host (ssh-keygen reads hashed
    names too)."""
    lookup, files = resolved(config, host, port)
    return [f for f in files if Path(f).is_file() and knows(f, lookup)]


def knows(known_hosts: str | Path, lookup: str) -> bool:
    """Whether the file holds a key for `lookup` (asked once per version of the file: every ssh
    command of a user-policy node asks)."""
    try:
        info = os.stat(known_hosts)
    except OSError:
        return False
    return _knows(str(known_hosts), lookup, (info.st_ino, info.st_size, info.st_mtime_ns))


@functools.lru_cache(maxsize=1024)
def _knows(known_hosts: str, lookup: str, _version: tuple) -> bool:
    done = subprocess.run(["ssh-keygen", "-F", lookup, "-f", known_hosts], capture_output=True,
                          text=True, timeout=30)
    return done.returncode == 0 and bool(done.stdout.strip())


def known_hosts_options(policy: str, cluster_file: Path, config: str | None, host: str,
                        port: int | None) -> list[str]:
    """ssh's -o options for host-key checking under `policy` (the first file listed is where
    accept-new writes)."""
    files, strict = [str(cluster_file)], "accept-new"
    if policy == "pinned":
        strict = "yes"
    elif policy == "user":
        mine = user_files_knowing(config, host, port)
        if mine:
            files, strict = mine, "yes"
    quoted = " ".join(f'"{f}"' if " " in f else f for f in files)
    return ["-o", f"StrictHostKeyChecking={strict}", "-o", f"UserKnownHostsFile={quoted}"]


def console_keys(text: str | None) -> list[str]:
    """`type base64` for every key in the console's last host-key block (a reboot prints
    another); empty while none is printed yet."""
    blocks = CONSOLE_BLOCK.findall(text or "")
    if not blocks:
        return []
    keys = [" ".join(m.group(1, 2)) for line in blocks[-1].splitlines() if (m := KEY_LINE.search(line))]
    return list(dict.fromkeys(keys))


def forget(known_hosts: Path, lookups: list[str]) -> None:
    """Drop every key line of these host names from the cluster's known_hosts (hashed ones too)."""
    for lookup in lookups:
        if known_hosts.is_file() and knows(known_hosts, lookup):
            subprocess.run(["ssh-keygen", "-R", lookup, "-f", str(known_hosts)], capture_output=True, timeout=30)
    Path(f"{known_hosts}.old").unlink(missing_ok=True)


def ssh_config() -> str | None:
    return os.environ.get(SSH_CONFIG_ENV) or None


def node_lookup(node) -> str:
    """The name a node's key is filed under in known_hosts, as ssh will look it up."""
    return resolved(ssh_config(), node.ssh_host or node.public_ip, node.ssh_port)[0]


def forget_recreated(known_hosts: Path, before, after) -> list[str]:
    """After a deploy: forget the keys of every node that is a new machine (another instance id,
    or another address, under the same name); returns their names."""
    old = {n.name: n for n in before.nodes} if before is not None else {}
    recreated = [n for n in after.nodes if n.transport == "ssh" and n.name in old
                 and (n.instance_id, n.public_ip) != (old[n.name].instance_id, old[n.name].public_ip)]
    forget(known_hosts, [node_lookup(x) for n in recreated for x in (old[n.name], n)])
    return [n.name for n in recreated]


def pin_console_keys(known_hosts: Path, nodes: list, console: Callable[[object], str | None],
                     timeout_s: float = CONSOLE_WAIT_S, interval_s: float = 10) -> list[str]:
    """Before the first connection: each node the cluster's known_hosts does not know yet gets
    the keys its console printed (polled until `timeout_s`). Raises naming the nodes whose console
    shows none; returns the names pinned."""
    todo = [n for n in nodes if not (known_hosts.is_file() and knows(known_hosts, node_lookup(n)))]
    pinned, deadline = {}, time.monotonic() + timeout_s
    while todo:
        for node in list(todo):
            keys = console_keys(console(node))
            if keys:
                pinned[node.name] = [f"{node_lookup(node)} {key}" for key in keys]
                todo.remove(node)
        if not todo or time.monotonic() + interval_s > deadline:
            break
        time.sleep(interval_s)
    if pinned:
        text = known_hosts.read_text() if known_hosts.is_file() else ""
        write_atomic(known_hosts, text + "".join(line + "\n" for lines in pinned.values() for line in lines))
    if todo:
        raise FatpipeError(f"{', '.join(n.name for n in todo)}: no SSH host keys on the console after "
                           f"{timeout_s:g} s (cloud-init prints them when it finishes); not connecting to a "
                           "key no one vouched for: run `fatpipe wait` again later")
    return list(pinned)


def deploy_forgetting_recreated(cluster, deploy: Callable[[], object]):
    """`deploy()` (which returns the new outputs), then forget the host keys of the nodes it
    recreated in the command's `cluster` (ops/reach/cluster.py): this project made them just now,
    so their new keys are not a machine in the middle."""
    try:
        before = read_outputs(cluster.outputs_path, cluster.name)
    except FatpipeError:  # none yet, or unreadable: nothing known to forget
        before = None
    after = deploy()
    forget_recreated(cluster.state_dir / "known_hosts", before, after)
    return after


def pin_cluster_keys(cluster, console: Callable[[object, object], str | None],
                     timeout_s: float = CONSOLE_WAIT_S) -> list[str]:
    """Before `wait` first connects: the deployed `cluster`'s nodes, when `pinned`, get the keys
    their consoles show (`console(outputs, node)`, the provider's API); other policies need nothing."""
    outputs = cluster.outputs
    if policy_for(outputs.provider) != "pinned":
        return []
    nodes = [n for n in outputs.nodes if n.transport == "ssh"]
    return pin_console_keys(cluster.state_dir / "known_hosts", nodes,
                            lambda node: console(outputs, node), min(timeout_s, CONSOLE_WAIT_S))
