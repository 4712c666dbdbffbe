"""Node venvs built from one download: node 0 fetches the wheels, every node installs them offline.

docs/ARCHITECTURE.md, "The node environment". Every node pulling GBs of wheels from the internet
at once is the mistake data staging avoids, so only node 0 asks the index (`pip download` into
`.fatpipe/wheels/<stamp>/`, kept across runs beside the venv). Node 0 then serves that folder on
its private address while the others install from it over the private links, and every venv
(node 0's too) installs with `--no-index` from those files alone, so all nodes resolve the same
versions. pip reads no config file on the nodes: the declaration alone says where wheels come from.

The private links carry the wheels over HTTP, not over the data chain (`trainer.staging.stage`):
that chain runs on torch, which is what the nodes are installing.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import REMOTE_VENV
from fatpipe.infra.nodevenv import (
    STAMP_FILE,
    TORCHFT,
    TORCHFT_MARKER,
    NodeVenv,
    base_requirements,
    project_requirements,
)
from fatpipe.node import source_file

from ..rdzv.noderun import NodeRun
from ..reach.asknode import NodeCallError, Step, answer_of, forget
from ..reach.transport import fan_out

WHEEL_DIR = ".fatpipe/wheels"  # on node 0, one folder per declaration stamp
COMPLETE = ".complete"  # written last: a folder without it is an interrupted download
PIP_ENV = "export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1"
BUILD_TIMEOUT_S = 1800
SERVE_TIMEOUT_S = 300  # a loaded node starts an interpreter slowly
PORT_LINE = re.compile(r"port (\d+)")
SERVE_PY = source_file("wheelserver").read_text()  # serves the folder, on node 0

Log = Callable[[str], None]


def wheel_folder(stamp: str) -> str:
    return f"{WHEEL_DIR}/{stamp}"


def trusted(url: str) -> list[str]:
    """pip ignores a plain-http index unless its host is trusted: one declared as http is."""
    parts = urlsplit(url)
    return ["--trusted-host", parts.netloc] if parts.scheme == "http" else []


# torchft serves fault_tolerance = "live" alone: nodes that cannot reach PyPI (or a Python its
# wheels do not fit) still get a venv for "restart", and the launch's environment check names
# the missing torchft should a run ask for "live" (ops.env.nodeenv).
NO_TORCHFT = ('echo "fatpipe: no torchft wheel for this node: fault_tolerance = \\"live\\" '
              'will not run here" >&2')


def install_line(stamp: str, venv: NodeVenv, find_links: str) -> str:
    """A venv from empty, installed from `find_links` alone (torchft when it is there), then
    stamped. --no-compile: byte-compiling all of torch's several thousand modules costs a node
    more CPU than the install itself; the trainer's imports compile the few hundred it uses on
    first start, into the venv's own caches."""
    py = f"{REMOTE_VENV}/bin/python"
    pip = f"{py} -m pip install -q --no-index --no-compile"
    source = shlex.join(["--find-links", find_links, *trusted(find_links)])
    torchft = shlex.quote(f"{TORCHFT}; {TORCHFT_MARKER}")
    return (f"python3 -m venv --clear {REMOTE_VENV}; "
            f"{pip} {source} {shlex.join(base_requirements(venv))}; "
            f"{pip} {source} {torchft} 2>/dev/null || {NO_TORCHFT}; "
            f"echo {stamp} > {STAMP_FILE}")


def read_stamp() -> str:
    return f"have=; [ -f {STAMP_FILE} ] && read -r have < {STAMP_FILE}; "


def download_command(stamp: str, venv: NodeVenv) -> str:
    """Node 0: download the wheels once (unless its folder is complete).

    torch and numpy come from torch's index as declared; the project's packages and torchft from
    PyPI, with the folder as a source too, so a package that needs torch takes the one already
    there (torchft's failure only leaves it out: NO_TORCHFT). pip
    runs from node 0's venv, made empty first when it is not this declaration's.
    """
    folder = wheel_folder(stamp)
    partial, py = f"{folder}.partial", f"{REMOTE_VENV}/bin/python"
    index = ["--index-url", venv.index, *trusted(venv.index)] if venv.index else []
    download = f"{py} -m pip download -q --only-binary=:all: -d {partial}"
    first = f"{download} {shlex.join([*index, venv.torch, 'numpy'])}; "
    extra = project_requirements(venv)
    rest = f"{download} --find-links {partial} {shlex.join(extra)}; " if extra else ""
    # torch named again: torchft's own requirement (torch>=2.7) must take the declared one.
    torchft = shlex.join([f"{TORCHFT}; {TORCHFT_MARKER}", venv.torch])
    rest += (f"{download} --retries 1 --timeout 15 --find-links {partial} {torchft} "
             f"|| {NO_TORCHFT}; ")
    return (
        f"{read_stamp()}set -e; {PIP_ENV}; "
        f'[ "$have" = {stamp} ] || python3 -m venv --clear {REMOTE_VENV}; '
        f"if [ ! -f {folder}/{COMPLETE} ]; then rm -rf {partial} {folder}; mkdir -p {partial}; "
        f"{first}{rest}touch {partial}/{COMPLETE}; mv {partial} {folder}; fi"
    )


def own_install_command(stamp: str, venv: NodeVenv) -> str:
    """Node 0: nothing when its venv has the stamp, else build it from its own wheel folder."""
    return (f'{read_stamp()}[ "$have" = {stamp} ] && exit 0; set -e; {PIP_ENV}; '
            f"{install_line(stamp, venv, wheel_folder(stamp))}")


def fetch_command(stamp: str, venv: NodeVenv) -> str:
    """Node 0 alone (no other node needs the wheels): download them, then build its venv from them."""
    return f"( {download_command(stamp, venv)} ) || exit $?; {own_install_command(stamp, venv)}"


def peer_command(stamp: str, venv: NodeVenv, url: str) -> str:
    """Another node: nothing when its venv has the stamp, else build it from node 0's folder."""
    return f'{read_stamp()}[ "$have" = {stamp} ] && exit 0; set -e; {PIP_ENV}; {install_line(stamp, venv, url)}'


def serve_command(stamp: str, private_ip: str) -> str:
    """Node 0: serve the folder on its private address (a free port); print the server's process
    group and its port (node/wheelserver.py, on the node)."""
    args = shlex.join([wheel_folder(stamp), private_ip, str(SERVE_TIMEOUT_S)])
    return f"python3 -c {shlex.quote(SERVE_PY)} {args}"


def stamp_step(node: NodeRun) -> Step:
    """The node program's step that reads the stamp of the declaration its venv was built from."""
    return Step("read_line", (STAMP_FILE,), node.plan.workdir)


def stale_nodes(nodes: list[NodeRun], stamp: str) -> list[NodeRun]:
    """The nodes whose venv was not built from this declaration (one that cannot say: stale)."""
    def have(n: NodeRun):
        try:
            return answer_of(n.transport, stamp_step(n), timeout=60).get("ok")
        except NodeCallError:
            return None

    return [n for n, found in zip(nodes, fan_out(have, nodes), strict=True) if found != stamp]


def private_url(node: NodeRun, port: int) -> str:
    ip = ipaddress.ip_address(node.plan.private_ip)  # a cluster file's value: an address, nothing else
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"http://{host}:{port}/"


def must(node: NodeRun, what: str, result) -> None:
    if not result.ok:
        raise FatpipeError(f"{node.transport.describe()}: {what} failed: {result.reason()}")


def build_node_envs(nodes: list[NodeRun], venv: NodeVenv, stamp: str, log: Log) -> None:
    """Bring every node's venv to `stamp`: one download on node 0, then every stale node installs
    at once, node 0 from its folder and the others from it over the private links."""
    stale = stale_nodes(nodes, stamp)
    if not stale:
        return
    for node in stale:  # what the command's first call read of their venv is about to change
        forget(node.transport)
    first, started = nodes[0], time.monotonic()
    peers = [n for n in stale if n is not first]
    if not peers:
        must(first, "building its venv", first.transport.run(first.sh(fetch_command(stamp, venv)),
                                                             timeout=BUILD_TIMEOUT_S))
        log(f"{first.name}: wheels in {wheel_folder(stamp)}, venv built from them "
            f"({time.monotonic() - started:.1f} s)")
        return
    must(first, "fetching the wheels", first.transport.run(first.sh(download_command(stamp, venv)),
                                                           timeout=BUILD_TIMEOUT_S))
    log(f"{first.name}: wheels in {wheel_folder(stamp)} ({time.monotonic() - started:.1f} s)")
    ip = str(ipaddress.ip_address(first.plan.private_ip))
    served = first.transport.run(first.sh(serve_command(stamp, ip)), timeout=SERVE_TIMEOUT_S + 30)
    pid = re.search(r"^pid (\d+)$", served.stdout, re.M)
    port = PORT_LINE.search(served.stdout)
    try:
        if not served.ok or not pid or not port:
            raise FatpipeError(f"{first.transport.describe()}: serving the wheels failed: "
                               f"{served.stdout.strip()[-300:] or served.reason()}")
        url, started = private_url(first, int(port.group(1))), time.monotonic()
        # Node 0 installs while the others do: its own install is no longer a wait for them.
        def install(n: NodeRun):
            command = own_install_command(stamp, venv) if n is first else peer_command(stamp, venv, url)
            return n.transport.run(n.sh(command), timeout=BUILD_TIMEOUT_S)

        installing = [first, *peers]
        results = fan_out(install, installing)
        for node, result in zip(installing, results, strict=True):
            where = "building its venv" if node is first else f"installing the wheels from {first.name}"
            must(node, where, result)
        log(f"{len(peers)} node(s): venv built from {first.name}'s wheels over the private links, "
            f"{first.name}'s from its folder at the same time ({time.monotonic() - started:.1f} s)")
    finally:
        if pid:
            first.transport.run(f"kill -- -{int(pid.group(1))}", timeout=30)
