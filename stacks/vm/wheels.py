"""The `vm` provider's wheel disk: torch, numpy and the project's packages as wheel files for the
guests' Python (Debian bookworm: CPython 3.11, x86_64, glibc 2.36), on a read-only ext4 disk that
every VM of the cluster attaches (docs/ARCHITECTURE.md, "The vm provider").

The guests reach no index, and unpacking GBs of wheels under CPU emulation takes many minutes, so
the disk holds them installed (`site-packages/`, byte-compiled here) beside the files (`wheels/`).
The vm seed's vendor data (stacks/vm/seed.py) mounts it, lets every venv in the guest see
`site-packages/` after its own, and points pip at `wheels/` alone: launch's build of the node venv
(ops.env.venvs, over SSH as on a cloud's nodes) then finds torch and numpy already there and
installs only what is missing, offline. The wheels come from this machine's pip (its
configuration: index, find-links), downloaded once per requirement list; the disk is cached by a
hash of the wheels themselves, so a changed wheel is a new disk, never a stale one.
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
from fatpipe.infra.nodevenv import TORCHFT, venv_requirements

from .image import locked

# The guests' interpreter and platform (the base image's suite): what the wheels must fit.
GUEST_PYTHON = "3.11"
GUEST_GLIBC_MINOR = 36
# pip does not widen a given --platform to the older glibcs it runs on: every one, named.
GUEST_PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(5, GUEST_GLIBC_MINOR + 1)),
                   "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64")
DISK_LABEL = "fpwheels"
MOUNT_POINT = "/opt/fatpipe/wheels"
SITE_PACKAGES = f"{MOUNT_POINT}/site-packages"  # the wheels installed; the .whl files in wheels/
DISK_LAYOUT = "wheels+site-packages/1"  # part of the disk's key: a new layout is a new disk
DOWNLOAD_TIMEOUT_S = 1800


def wheel_requirements(venv) -> list[str]:
    """What launch's venv build installs (infra.nodevenv.venv_requirements), as pip arguments;
    torchft without its marker, which pip would judge by this machine's Python, not the guests'
    (3.11 on x86_64, which it fits). The requirements file is relative to the project folder."""
    return venv_requirements(venv, torchft=TORCHFT)


def index_args(venv, declared: bool) -> list[str]:
    """torch's index only where the project or $FATPIPE_TORCH_INDEX_URL names one: otherwise the
    wheels are those this machine's pip finds (its configured index and find-links)."""
    return ["--extra-index-url", venv.index] if declared and venv.index else []


def wheel_disk(cache: Path, requirements: list[str], index: list[str], log=print) -> Path:
    """The cached disk for `requirements`, built first when missing (root for the files' owner;
    pip download and install --target, then `mkfs.ext4 -d`: no loop mount)."""
    cache = Path(cache).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    request = hashlib.sha256(json.dumps([requirements, index, GUEST_PYTHON, GUEST_PLATFORMS]).encode())
    wheels = cache / f"wheels-src-{request.hexdigest()[:16]}"
    with locked(cache / ".wheels.lock"):
        _download(wheels, requirements, index, log)
        key = hashlib.sha256(f"{DISK_LAYOUT}/{contents_key(wheels)}".encode()).hexdigest()[:16]
        disk = cache / f"wheels-{key}" / "wheels.img"
        if disk.exists():
            return disk
        log(f"vm: wheel disk {key} from {len(list(wheels.glob('*.whl')))} wheels (install --target, mkfs.ext4 -d)")
        work = cache / f".wheels-build-{key}"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(wheels, work / "tree" / "wheels")
        _install(work / "tree")
        size_mib = sum(p.stat().st_size for p in (work / "tree").rglob("*") if p.is_file()) * 5 // 4 // 2**20 + 128
        _run("mkfs.ext4", ["mkfs.ext4", "-q", "-L", DISK_LABEL, "-d", str(work / "tree"), str(work / "wheels.img"),
                           f"{size_mib}M"])
        shutil.rmtree(work / "tree")
        os.replace(work, disk.parent)
    return disk


def _install(tree: Path) -> None:
    """Every downloaded wheel (the resolved closure: --no-deps, nothing else) unpacked for the
    guests' Python, byte-compiled here: the disk is read-only, a guest could not cache its own."""
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--only-binary=:all:",
            *_guest_args(), "--target", str(tree / "site-packages"), *map(str, sorted((tree / "wheels").glob("*.whl")))]
    _run("pip install --target", argv)


def _guest_args() -> list[str]:
    return ["--python-version", GUEST_PYTHON, "--implementation", "cp",
            *(arg for platform in GUEST_PLATFORMS for arg in ("--platform", platform))]


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
    """pip download for the guests' Python and platform into a fresh folder, the files already
    downloaded offered first (`--find-links`), which then replaces `folder`: it holds exactly
    what this resolution chose, never an older version beside a newer one (a disk built from
    both would not install)."""
    folder.mkdir(exist_ok=True)
    fresh = folder.with_name(folder.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", *_guest_args(),
            "-d", str(fresh), "--find-links", str(folder), *index, *requirements]
    log(f"vm: wheels for the guests' Python {GUEST_PYTHON}: {' '.join(requirements)}")
    _run("pip download", argv)
    shutil.rmtree(folder)
    os.replace(fresh, folder)


def _run(what: str, argv: list[str]) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FatpipeError(f"vm wheel disk: `{what}` did not finish in {DOWNLOAD_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
        raise FatpipeError(f"vm wheel disk: `{what}` failed ({proc.returncode}): {tail[0]}")

