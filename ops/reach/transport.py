"""How fatpipe reaches a node: the OpenSSH client, `ip netns exec`, or this machine, behind one interface.

Every command is a bash snippet run on the node from the node's home (ssh) or this process's
folder (netns, local). `fan_out` runs one function per node in parallel threads, so a 64-node
cluster costs one round trip, not 64; ops/reach/asknode.py makes a command's checks one.
"""

from __future__ import annotations

import functools
import os
import shlex
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fatpipe.infra.errors import FatpipeError

from .hostkeys import known_hosts_options, policy_for, ssh_config
from .keepalive import alive_options

CONTROL_DIR_ENV = "FATPIPE_SSH_CONTROL_DIR"
CONNECT_TIMEOUT_S = 10
CONTROL_PERSIST_S = 120
GITIGNORE_FILTER = "--filter=:- .gitignore"  # the project copy leaves out what .gitignore files do

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Result:
    """What a command on a node returned; `returncode` 124 means fatpipe's own timeout hit."""

    returncode: int
    stdout: str
    stderr: str

    ok = property(lambda self: self.returncode == 0)

    def reason(self) -> str:
        """The last non-empty line of stderr (or stdout): what a one-line report should say."""
        for text in (self.stderr, self.stdout):
            lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
            if lines:
                return lines[-1]
        return f"exit status {self.returncode}"


def _run(argv: Sequence[str], timeout: float | None, stdin_text: str | None = None) -> Result:
    try:
        # A session of its own: Ctrl-C reaches fatpipe alone, which then stops the nodes in order.
        stdin = {"input": stdin_text} if stdin_text is not None else {"stdin": subprocess.DEVNULL}
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, start_new_session=True, **stdin,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        return Result(124, out, f"timed out after {timeout:g} s")
    except FileNotFoundError as e:
        return Result(127, "", f"{e.filename}: command not found")
    return Result(done.returncode, done.stdout, done.stderr)


class Transport:
    """Runs bash on one node; subclasses say how. `shares_fs`: the node sees this machine's files."""

    kind = "?"
    shares_fs = False
    answers = None  # the NodeAnswers of the cluster that made it (ops/reach/asknode.py)

    def __init__(self, node_name: str):
        self.node_name = node_name

    def argv(self, command: str) -> list[str]:
        """The local command line that runs the bash snippet `command` on the node."""
        raise NotImplementedError

    def run(self, command: str, timeout: float | None = 60, stdin_text: str | None = None) -> Result:
        """Run `command` on the node; `stdin_text` is its standard input (else none)."""
        return _run(self.argv(command), timeout, stdin_text)

    def make_dir(self, dest: str) -> Result:  # a round trip: a launch's claim makes them first
        return self.run(f"mkdir -p -- {shlex.quote(dest)}", timeout=CONNECT_TIMEOUT_S * 3)
    def popen(self, command: str) -> subprocess.Popen:
        """Start `command` on the node with its stdout (and stderr) as one text pipe."""
        return subprocess.Popen(
            self.argv(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1, errors="replace",
            start_new_session=True,
        )

    def push(self, src: Path, dest: str, excludes: Iterable[str] = (), timeout: float = 900,
             made: bool = False) -> Result:
        """Copy the folder `src` to `dest` on the node (its home's), deleting extras; `made`: it exists."""
        raise FatpipeError(f"{self.describe()} shares this machine's files; nothing to copy")

    def push_files(self, src: Path, dest: str, patterns: Iterable[str], timeout: float = 900,
                   made: bool = False) -> Result:
        """Copy only the top-level files of `src` matching `patterns` to `dest` on the node;
        nothing else there is touched (no deletes)."""
        raise FatpipeError(f"{self.describe()} shares this machine's files; nothing to copy")

    def pull(self, src: str, dest: Path, excludes: Iterable[str] = (), timeout: float = 900,
             link_dest: Path | None = None) -> Result:
        """Copy the folder `src` on the node into the local folder `dest` (nothing deleted);
        files equal to those in `link_dest` are hard links to them, not copies."""
        raise FatpipeError(f"{self.describe()} shares this machine's files; nothing to copy")

    def copy_to(self, src: str, dest: str, extra: Iterable[str] = (), timeout: float = 900) -> Result:
        """rsync `src` (a local path as rsync reads it) to `dest` on the node, with rsync options `extra`."""
        raise FatpipeError(f"{self.describe()} shares this machine's files; nothing to copy")

    def describe(self) -> str:
        return f"{self.node_name} ({self.kind})"

class LocalTransport(Transport):
    """A node that is this machine (sim loopback nodes on 127.x addresses)."""

    kind = "local"
    shares_fs = True

    def argv(self, command: str) -> list[str]:
        return ["bash", "-c", command]


class NetnsTransport(Transport):
    """A node that is a network namespace on this machine (sim netns nodes; needs root)."""

    kind = "netns"
    shares_fs = True

    def __init__(self, node_name: str, netns: str):
        super().__init__(node_name)
        self.netns = netns

    def argv(self, command: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, "bash", "-c", command]

    def describe(self) -> str:
        return f"{self.node_name} (netns {self.netns})"


class SshTransport(Transport):
    """A remote node through the OpenSSH client, so ~/.ssh/config, agents and jump hosts apply.

    Connections are multiplexed (one TCP+auth handshake per node, reused for minutes), never
    prompt (BatchMode), and host keys are checked by `host_keys`, a policy of ops/reach/hostkeys.py:
    against the cluster's own known_hosts (pinned, or first contact with accept-new) or the
    user's own files for a host they know.
    """

    kind = "ssh"

    def __init__(self, node_name: str, host: str, known_hosts: Path, user: str = "", port: int | None = None,
                 config: str | None = None, identity: str | None = None, host_keys: str = "accept-new"):
        super().__init__(node_name)
        self.host, self.user, self.port, self.identity = host, user, port, identity
        self.known_hosts, self.host_keys = Path(known_hosts), host_keys
        self.config = config if config is not None else ssh_config()

    def ssh_options(self) -> list[str]:
        """ssh's options, without the destination: shared by commands and rsync's -e."""
        opts = ["ssh"]
        if self.config:
            opts += ["-F", str(Path(self.config).expanduser())]
        opts += [
            "-o", "BatchMode=yes",
            *known_hosts_options(self.host_keys, self.known_hosts, self.config, self.host, self.port),
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            *alive_options(),
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={control_dir()}/%C",
            "-o", f"ControlPersist={CONTROL_PERSIST_S}",
            "-o", "LogLevel=ERROR",
        ]
        if self.identity:  # this key only: an agent's other keys must not use up the tries
            opts += ["-i", str(Path(self.identity).expanduser()), "-o", "IdentitiesOnly=yes"]
        if self.port:
            opts += ["-p", str(self.port)]
        if self.user:
            opts += ["-l", self.user]
        return opts

    def argv(self, command: str) -> list[str]:
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        # The remote login shell may be sh or zsh: hand the snippet to bash explicitly.
        # `--`: nothing after it is an option, whatever the host value holds.
        return [*self.ssh_options(), "--", self.host, "bash -c " + shlex.quote(command)]

    def rsync_argv(self, src: str, dest: str, extra: Iterable[str] = ()) -> list[str]:
        """rsync's command line through this node's ssh (`dest` names the remote side as `host:path`)."""
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        # -s: the remote path travels inside rsync's protocol, never through the node's shell.
        return ["rsync", "-azs", "--partial", "-e", shlex.join(self.ssh_options()), *extra, "--", src, dest]

    def _rsync(self, src: str, dest: str, extra: list[str], timeout: float) -> Result:
        return _run(self.rsync_argv(src, dest, extra), timeout)

    def push(self, src: Path, dest: str, excludes: Iterable[str] = (), timeout: float = 900,
             made: bool = False) -> Result:
        if not made and not (made := self.make_dir(dest)).ok:
            return made
        filters = [f"--exclude={pattern}" for pattern in excludes]
        # Honour the project's .gitignore files too: nothing a repository leaves out is shipped.
        filters.append(GITIGNORE_FILTER)
        return self._rsync(f"{src}/", f"{self.remote_host()}:{dest}/", ["--delete", *filters], timeout)

    def push_files(self, src: Path, dest: str, patterns: Iterable[str], timeout: float = 900,
                   made: bool = False) -> Result:
        if not made and not (made := self.make_dir(dest)).ok:
            return made
        return self._rsync(f"{src}/", f"{self.remote_host()}:{dest}/", only_filters(patterns), timeout)

    def copy_to(self, src: str, dest: str, extra: Iterable[str] = (), timeout: float = 900) -> Result:
        return self._rsync(src, f"{self.remote_host()}:{dest}", ["--partial", *extra], timeout)

    def pull(self, src: str, dest: Path, excludes: Iterable[str] = (), timeout: float = 900,
             link_dest: Path | None = None) -> Result:
        Path(dest).mkdir(parents=True, exist_ok=True)
        extra = [f"--exclude={pattern}" for pattern in excludes]
        if link_dest is not None:
            extra.append(f"--link-dest={Path(link_dest).resolve()}")
        return self._rsync(f"{self.remote_host()}:{src}/", f"{dest}/", extra, timeout)

    def remote_host(self) -> str:  # as an rsync remote spec names it: an IPv6 address in brackets
        return f"[{self.host}]" if ":" in self.host else self.host

    def describe(self) -> str:
        return f"{self.node_name} (ssh {self.user + '@' if self.user else ''}{self.host})"


def only_filters(patterns: Iterable[str]) -> list[str]:
    """rsync filters that send the top-level files matching `patterns` and nothing else; no
    --delete, so what the node made beside them stays."""
    return [*(f"--include=/{pattern}" for pattern in patterns), "--exclude=*"]


def control_dir() -> Path:
    """Where ssh's multiplexing sockets live: short (a socket path must fit in 108 bytes), private.

    $FATPIPE_SSH_CONTROL_DIR overrides the default folder under the temp dir. A folder someone
    else owns, or others may write (a socket planted there would carry our sessions), is never
    used: this process makes a private one instead.
    """
    path = Path(os.environ.get(CONTROL_DIR_ENV) or Path(tempfile.gettempdir()) / f"fatpipe-ssh-{os.getuid()}")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return private_control_dir()
    return path if is_private_dir(path) else private_control_dir()


def is_private_dir(path: Path) -> bool:
    """A real folder (not a link) of this user that no one else may enter or write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


@functools.cache
def private_control_dir() -> Path:
    """A fresh folder of this process's own (mode 0700), made once per process."""
    return Path(tempfile.mkdtemp(prefix=f"fatpipe-ssh-{os.getuid()}-"))


def transport_for(node, state_dir: Path, ssh_user: str = "", provider: str = "") -> Transport:
    """The transport a node names (`transport`, `netns`, `public_ip`; optional `ssh_user`, `ssh_port`).

    `node` is an outputs node or a rendezvous node plan; ssh host keys are checked as the
    `provider`'s policy says (ops/reach/hostkeys.py), with `<state_dir>/known_hosts` the cluster's own file.
    """
    if node.transport == "local":
        return LocalTransport(node.name)
    if node.transport == "netns":
        return NetnsTransport(node.name, node.netns)
    host = node.ssh_host or node.public_ip
    return SshTransport(node.name, host, Path(state_dir) / "known_hosts", user=node.ssh_user or ssh_user,
                        port=node.ssh_port, identity=node.ssh_key_file, host_keys=policy_for(provider))


def transports_for(outputs, state_dir: Path) -> list[Transport]:
    """One transport per node of a cluster's outputs, in node order."""
    return [transport_for(node, state_dir, outputs.ssh_user, outputs.provider) for node in outputs.nodes]


def fan_out(fn: Callable[[T], R], items: Sequence[T], max_workers: int = 32) -> list[R]:
    """`[fn(x) for x in items]`, run in parallel threads; results keep the order of `items`."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        return list(pool.map(fn, items))
