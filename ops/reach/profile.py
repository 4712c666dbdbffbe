"""Apply or revert the node profile on a machine over SSH (ssh clusters, and sim nodes with sshd).

The applier (`node/applier.py`) travels as a program with the profile appended, on the standard
input of `python3 -` (no file on the node, where another login could swap it before it runs),
and runs as root (`sudo -n` when the login is not root). Every failure comes back as one line naming the
host: it does not answer, its host key changed, the login has no passwordless sudo, or the
profile failed there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.node import source_file

from .transport import SshTransport

AGENT = source_file("applier")
FIREWALL = source_file("hostfirewall")  # the applier imports it as `hostfirewall`
APPLY_TIMEOUT_S = 1800  # apt on a fresh machine can take minutes


@dataclass(frozen=True)
class SshHost:
    """One machine as the profile's provisioners see it (a terraform_data input)."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    host_keys: str = "accept-new"  # ops/reach/hostkeys.py: `user` for the machines of an ssh cluster

    def transport(self, known_hosts: Path) -> SshTransport:
        return SshTransport(self.name, self.address, known_hosts, user=self.user, port=self.port,
                            identity=self.key_file, host_keys=self.host_keys)

    def where(self) -> str:
        return f"{self.name} ({self.user}@{self.address}:{self.port})"


def agent_program(profile: dict) -> str:
    """The program sent: the firewall and the applier, each loaded as a module of its own (each
    keeps its `from __future__` line first), then the applier's main with `profile`."""
    return (
        "import json, sys, types\n"
        "def load(name, source):\n"
        "    module = types.ModuleType(name)\n"
        "    sys.modules[name] = module\n"
        "    exec(compile(source, name, 'exec'), module.__dict__)\n"
        "    return module\n"
        f"load('hostfirewall', {FIREWALL.read_text()!r})\n"
        f"agent = load('applier', {AGENT.read_text()!r})\n"
        f"agent.PROFILE = json.loads({json.dumps(json.dumps(profile))})\n"
        "agent.main()\n"
    )


def agent_command(action: str, as_root: bool) -> str:
    """The command on the node that runs the program on its standard input for `action`."""
    # sudo -n: never prompt; a login without passwordless sudo fails at once, and says so.
    python = "python3" if as_root else "sudo -n python3"
    return f"{python} - {action}"


def run_agent(host: SshHost, action: str, profile: dict, known_hosts: Path) -> dict:
    """Run the applier on `host`; its closing JSON line, or FatpipeError naming the host."""
    transport = host.transport(known_hosts)
    result = transport.run(agent_command(action, host.user == "root"), timeout=APPLY_TIMEOUT_S,
                           stdin_text=agent_program(profile))
    if not result.ok:
        raise FatpipeError(f"host {host.where()}: {action} of the node profile failed: {explain(result)}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def explain(result) -> str:
    """What went wrong, in the words a user can act on."""
    text = f"{result.stderr}\n{result.stdout}"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "Host key verification failed" in text:
        return ("its host key changed since fatpipe first saw it; if the machine was rebuilt, remove its "
                "line from the cluster's known_hosts (.fatpipe/<cluster>/known_hosts)")
    if "a password is required" in text or "a terminal is required" in text:
        return "the login has no passwordless sudo, which tuning the kernel needs (or log in as root)"
    if result.returncode == 255:
        return f"it does not answer over SSH: {result.reason()}"
    if result.returncode == 124:
        return result.reason()
    return result.reason()


def apply_profile(host: SshHost, profile: dict, known_hosts: Path) -> dict:
    """Tune `host` as `profile` declares; returns what the kernel did not take (reported, not hidden)."""
    # The port it is reached on stays open through the host firewall (docs/ARCHITECTURE.md).
    return run_agent(host, "apply", {**profile, "ssh_port": host.port}, known_hosts)


def revert_profile(host: SshHost, unit: str, known_hosts: Path) -> dict:
    """Undo what fatpipe changed on `host` (the project folder is `ops.reach.projectdir`'s, as the login)."""
    return run_agent(host, "revert", {"unit": unit}, known_hosts)
