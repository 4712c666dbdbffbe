"""Apply or revert the node profile on a machine over SSH (ssh clusters, and sim nodes with sshd).

The applier (`node_agent.py`) travels as a program with the profile appended and runs as
root (`sudo -n` when the login is not root). Every failure comes back as one line naming the
host: it does not answer, its host key changed, the login has no passwordless sudo, or the
profile failed there.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from .transport import SshTransport

AGENT = Path(__file__).with_name("node_agent.py")
APPLY_TIMEOUT_S = 1800  # apt on a fresh machine can take minutes


@dataclass(frozen=True)
class SshHost:
    """One machine as the profile's provisioners see it (a terraform_data input)."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None

    def transport(self, known_hosts: Path) -> SshTransport:
        return SshTransport(self.name, self.address, known_hosts, user=self.user, port=self.port,
                            identity=self.key_file)

    def where(self) -> str:
        return f"{self.name} ({self.user}@{self.address}:{self.port})"


def agent_command(action: str, profile: dict, as_root: bool) -> str:
    """The shell command that runs the applier on the node with `profile` for `action`."""
    program = AGENT.read_text() + f"\nPROFILE = json.loads({json.dumps(json.dumps(profile))})\nmain()\n"
    encoded = base64.b64encode(program.encode()).decode()
    # sudo -n: never prompt; a login without passwordless sudo fails at once, and says so.
    python = "python3" if as_root else "sudo -n python3"
    return f"echo {encoded} | base64 -d > /tmp/fatpipe-agent.$$ && {python} /tmp/fatpipe-agent.$$ {action}; " \
           f"rc=$?; rm -f /tmp/fatpipe-agent.$$; exit $rc"


def run_agent(host: SshHost, action: str, profile: dict, known_hosts: Path) -> dict:
    """Run the applier on `host`; its closing JSON line, or FatpipeError naming the host."""
    transport = host.transport(known_hosts)
    result = transport.run(agent_command(action, profile, host.user == "root"), timeout=APPLY_TIMEOUT_S)
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
    return run_agent(host, "apply", profile, known_hosts)


def revert_profile(host: SshHost, unit: str, known_hosts: Path) -> dict:
    """Undo what fatpipe changed on `host` (the project folder is `ops.projectdir`'s, as the login)."""
    return run_agent(host, "revert", {"unit": unit}, known_hosts)
