"""Is there a torch wheel for the nodes? Ask the index before anything is paid for.

docs/ARCHITECTURE.md, "The node environment": pip resolves the declared torch for the node's
Python and architecture (`pip install --dry-run --no-deps --only-binary=:all:` with
`--python-version` and `--platform`, nothing installed) and says which wheel it would take.
pip reads no config of this machine, as on the nodes: the declaration alone names the index.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.nodevenv import NodeVenv

# Linux wheels of torch carry one of these tags (PyPI: manylinux; the CPU index: often linux_*).
PLATFORM_TAGS = ("manylinux_2_28_{arch}", "manylinux2014_{arch}", "linux_{arch}")
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
PYTHON_VERSION = re.compile(r"^3\.\d{1,2}$")
WHEEL_TIMEOUT_S = 300
# pip's words for an index it could not reach (as opposed to one that lacks the wheel).
UNREACHABLE = ("NameResolutionError", "NewConnectionError", "ConnectTimeoutError", "Failed to resolve",
               "Network is unreachable", "Connection refused")


class IndexUnreachable(FatpipeError):
    """The index did not answer: nothing is known about the wheel (offline, or a blocked host)."""


def pip_argv(venv: NodeVenv, python_version: str, machine: str, target: Path) -> list[str]:
    """The dry run: one argument per value, never shell text."""
    arch = ARCHES.get(machine.lower())
    if arch is None:
        raise FatpipeError(f"no torch wheels are built for the node architecture {machine!r}")
    if not PYTHON_VERSION.match(python_version):
        raise FatpipeError(f"{python_version!r} is not a Python version such as 3.12")
    platforms = [arg for tag in PLATFORM_TAGS for arg in ("--platform", tag.format(arch=arch))]
    index = ["--index-url", venv.index] if venv.index else []
    return [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
            "--only-binary=:all:", "--disable-pip-version-check", "--quiet", "--retries", "1", "--timeout", "15",
            "--python-version", python_version,
            *platforms, "--target", str(target / "t"), "--report", str(target / "report.json"), *index,
            venv.torch]


def node_pip_env() -> dict[str, str]:
    """pip as the nodes run it (ops/env/venvs.py): no config file, no PIP_* setting of this machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull}


def torch_wheel(venv: NodeVenv, python_version: str, machine: str) -> str:
    """The file name of the torch wheel the nodes would install, or a FatpipeError naming what is missing."""
    with tempfile.TemporaryDirectory(prefix="fatpipe-wheel-") as tmp:
        argv = pip_argv(venv, python_version, machine, Path(tmp))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=WHEEL_TIMEOUT_S, env=node_pip_env())
        except subprocess.TimeoutExpired:
            raise IndexUnreachable(f"the index {venv.index or 'PyPI'} did not answer within "
                                   f"{WHEEL_TIMEOUT_S} s") from None
        report = Path(tmp) / "report.json"
        if done.returncode != 0 and any(word in done.stderr for word in UNREACHABLE):
            raise IndexUnreachable(f"the index {venv.index or 'PyPI'} did not answer")
        if done.returncode != 0 or not report.is_file():
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            named = [line for line in lines if "No matching distribution" in line or "satisfies the requ" in line]
            why = (named or lines or [f"pip exit status {done.returncode}"])[-1]
            raise FatpipeError(f"no wheel for {venv.torch} on Python {python_version} {machine} at "
                               f"{venv.index or 'PyPI'}: {why}")
        url = json.loads(report.read_text())["install"][0]["download_info"]["url"]
    return url.rsplit("/", 1)[-1].split("#", 1)[0]
