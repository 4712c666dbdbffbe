"""The `vm` provider's wheel disk: torch, numpy and the project's packages as wheel files for the
guests' Python (Debian bookworm: CPython 3.11, x86_64, glibc 2.36), on a read-only ext4 disk that
every VM of the cluster attaches (docs/ARCHITECTURE.md, "The vm provider").

The guests reach no index, so the node venv's build at boot (stacks/bootenv.py, the clouds' own
user data) installs from this disk: the vm seed's vendor data (stacks/vmseed.py) mounts it and
points pip at it (`PIP_NO_INDEX`, `PIP_FIND_LINKS`) before the user data runs. The wheels come from this machine's
pip (its configuration: index, find-links), downloaded once per requirement list; the disk is
cached by a hash of the wheels themselves, so a changed wheel is a new disk, never a stale one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from .vmimage import _locked

# The guests' interpreter and platform (the base image's suite): what the wheels must fit.
GUEST_PYTHON = "3.11"
GUEST_GLIBC_MINOR = 36
# pip does not widen a given --platform to the older glibcs it runs on: every one, named.
GUEST_PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(5, GUEST_GLIBC_MINOR + 1)),
                   "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64")
DISK_LABEL = "fpwheels"
MOUNT_POINT = "/opt/fatpipe/wheels"
DOWNLOAD_TIMEOUT_S = 1800


def wheel_requirements(venv) -> list[str]:
    """What the boot build installs (stacks/bootenv.py), as pip arguments: torch, numpy, the
    requirements file (relative to the project folder, where node-up runs) and the packages."""
    return [venv.torch, "numpy", *(["-r", venv.requirements] if venv.requirements else []), *venv.packages]


def index_args(venv, declared: bool) -> list[str]:
    """torch's index only where the project or $FATPIPE_TORCH_INDEX_URL names one: otherwise the
    wheels are those this machine's pip finds (its configured index and find-links)."""
    return ["--extra-index-url", venv.index] if declared and venv.index else []


def wheel_disk(cache: Path, requirements: list[str], index: list[str], log=print) -> Path:
    """The cached disk holding the wheels of `requirements`, built first when missing (root for
    the files' owner; pip download, then `mkfs.ext4 -d`: no loop mount)."""
    cache = Path(cache).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    request = hashlib.sha256(json.dumps([requirements, index, GUEST_PYTHON, GUEST_PLATFORMS]).encode())
    wheels = cache / f"wheels-src-{request.hexdigest()[:16]}"
    with _locked(cache / ".wheels.lock"):
        _download(wheels, requirements, index, log)
        key = contents_key(wheels)
        disk = cache / f"wheels-{key}" / "wheels.img"
        if disk.exists():
            return disk
        log(f"vm: wheel disk {key} from {len(list(wheels.glob('*.whl')))} wheels (mkfs.ext4 -d)")
        work = cache / f".wheels-build-{key}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        size_mib = sum(p.stat().st_size for p in wheels.iterdir()) * 5 // 4 // 2**20 + 64
        _run("mkfs.ext4", ["mkfs.ext4", "-q", "-L", DISK_LABEL, "-d", str(wheels), str(work / "wheels.img"),
                           f"{size_mib}M"])
        os.replace(work, disk.parent)
    return disk


def contents_key(folder: Path) -> str:
    """A hash of every file's name and bytes: the disk's identity."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def _download(folder: Path, requirements: list[str], index: list[str], log) -> None:
    """pip download for the guests' Python and platform; files already there are kept."""
    folder.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", GUEST_PYTHON,
            "--implementation", "cp",
            *(arg for platform in GUEST_PLATFORMS for arg in ("--platform", platform)), "-d", str(folder), *index, *requirements]
    log(f"vm: wheels for the guests' Python {GUEST_PYTHON}: {' '.join(requirements)}")
    _run("pip download", argv)


def _run(what: str, argv: list[str]) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FatpipeError(f"vm wheel disk: `{what}` did not finish in {DOWNLOAD_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
        raise FatpipeError(f"vm wheel disk: `{what}` failed ({proc.returncode}): {tail[0]}")

