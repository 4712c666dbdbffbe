"""The `vm` provider's base image: Debian bookworm with a cloud kernel and cloud-init, built offline
from the package mirror this machine's apt already uses, cached by a hash of its recipe.

No loop mount and no partition table: debootstrap fills a folder, `mkfs.ext4 -d` turns it into
the root filesystem, QEMU boots the kernel and initrd copied out beside it (docs/ARCHITECTURE.md,
"The vm provider").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from ..node_profile import PACKAGES

SUITE = "bookworm"
# What a cloud image of the distribution has, plus the node profile's own packages (the guests
# have no route to a mirror, so cloud-init's package step must find them installed), plus
# python3-cffi-backend (debootstrap misses it for cloud-init's cryptography) and locales
# (cloud-init's locale module fails without it).
IMAGE_PACKAGES = ("linux-image-cloud-amd64", "initramfs-tools", "cloud-init", "openssh-server",
                  "python3", "python3-cffi-backend", "locales", "ifupdown", "sudo", "iproute2",
                  *PACKAGES)
IMAGE_SIZE = "3G"  # sparse: the filesystem holds about 1 GB; the rest is room for a run
# Written into the tree before mkfs; every line is part of the recipe (and so of its hash).
IMAGE_FILES = {
    "etc/fstab": "/dev/vda / ext4 rw,discard,errors=remount-ro 0 1\n",
    "etc/hostname": "localhost\n",
    "etc/machine-id": "",  # empty: every VM makes its own at first boot
    # The guests reach no mirror: apt's update and installs of what is present still succeed.
    "etc/apt/sources.list": "# fatpipe vm image: offline, every package the node profile needs is installed\n",
    # Only the NoCloud seed: probing the clouds' metadata services would wait out their timeouts.
    "etc/cloud/cloud.cfg.d/90_fatpipe.cfg": "datasource_list: [NoCloud, None]\n",
    # Generated at build time, and already the system locale: cloud-init's locale module
    # (default en_US.UTF-8) then has nothing to regenerate, which under TCG takes minutes.
    "etc/locale.gen": "en_US.UTF-8 UTF-8\n",
    "etc/default/locale": "LANG=en_US.UTF-8\n",
}
BUILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class BaseImage:
    """A built image: the root disk and the kernel and initrd QEMU boots it with."""

    folder: Path

    @property
    def disk(self) -> Path:
        return self.folder / "base.qcow2"

    @property
    def kernel(self) -> Path:
        return self.folder / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.folder / "initrd.img"


def default_cache() -> Path:
    """FATPIPE_VM_CACHE, else the user's cache folder: one image serves every project."""
    if os.environ.get("FATPIPE_VM_CACHE"):
        return Path(os.environ["FATPIPE_VM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fatpipe" / "vm-image"


def recipe() -> dict:
    return {"suite": SUITE, "packages": sorted(IMAGE_PACKAGES), "size": IMAGE_SIZE, "files": IMAGE_FILES}


def recipe_key() -> str:
    """A change to the recipe gives another folder, so a cached image is never a stale one."""
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:16]


def apt_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt uses (deb822 `.sources` or one-line `sources.list`)."""
    texts = [p.read_text(errors="replace") for p in [sources_dir / "sources.list",
                                                     *sorted((sources_dir / "sources.list.d").glob("*"))]
             if p.is_file() and p.suffix in (".list", ".sources")]
    for text in texts:
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            enabled = not re.search(r"^Enabled:\s*no", stanza, re.M | re.I)
            if uris and suites and enabled and SUITE in suites.group(1).split():
                return uris.group(1)
        for line in text.splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 3 and fields[0] == "deb":
                rest = [f for f in fields[1:] if not f.startswith("[")]
                if len(rest) >= 2 and rest[1] == SUITE:
                    return rest[0]
    raise FatpipeError(f"no apt source for Debian {SUITE} on this machine (/etc/apt/sources.list*): "
                       "the vm image is built from the mirror apt already uses")


def cached_image(cache: Path) -> BaseImage | None:
    image = BaseImage(Path(cache) / recipe_key())
    return image if image.disk.exists() else None


def missing_tools() -> list[str]:
    tools = {"debootstrap": "debootstrap", "mkfs.ext4": "e2fsprogs", "qemu-img": "qemu-utils",
             "qemu-system-x86_64": "qemu-system-x86", "cloud-localds": "cloud-image-utils"}
    return sorted({package for tool, package in tools.items() if not shutil.which(tool)})


def build_image(cache: Path, log=print, mirror: str | None = None) -> BaseImage:
    """The cached image for the current recipe, built first when missing (root; minutes).

    Built in a temporary folder renamed into place, under a lock, so concurrent callers wait for
    one build and nobody sees a half image."""
    cache = Path(cache).resolve()
    found = cached_image(cache)
    if found:
        return found
    if os.geteuid() != 0:
        raise FatpipeError("building the vm image needs root (debootstrap, mkfs.ext4 -d as the files' owner)")
    if missing_tools():
        raise FatpipeError(f"the vm image needs these Debian packages: {' '.join(missing_tools())} "
                           "(make system-packages)")
    cache.mkdir(parents=True, exist_ok=True)
    with locked(cache / ".lock"):
        found = cached_image(cache)
        if found:
            return found
        mirror = mirror or apt_mirror()
        # Callers are serialized by the lock: one build folder per recipe. A failed build's
        # stays (its logs say why) and the next attempt starts it afresh.
        work = cache / f".build-{recipe_key()}"
        shutil.rmtree(work, ignore_errors=True)
        _build(work, mirror, log)
        (work / "recipe.json").write_text(json.dumps(recipe(), indent=1) + "\n")
        shutil.rmtree(work / "tree")
        os.replace(work, cache / recipe_key())
    return BaseImage(cache / recipe_key())


def _build(work: Path, mirror: str, log) -> None:
    tree = work / "tree"
    tree.mkdir(parents=True)
    log(f"vm image: debootstrap {SUITE} from {mirror} (a few minutes)")
    _run(["debootstrap", "--include=" + ",".join(IMAGE_PACKAGES), SUITE, str(tree), mirror], work / "debootstrap.log")
    for name, content in IMAGE_FILES.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    _run(["chroot", str(tree), "locale-gen"], work / "chroot.log")
    # cloud-init makes fresh host keys on first boot; no two VMs share the build's.
    for key in (tree / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    shutil.rmtree(tree / "var/cache/apt/archives", ignore_errors=True)
    (tree / "var/cache/apt/archives/partial").mkdir(parents=True)
    kernels = sorted((tree / "boot").glob("vmlinuz-*"))
    initrds = sorted((tree / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise FatpipeError(f"vm image: no kernel or initrd in the debootstrap tree (see {work / 'debootstrap.log'})")
    shutil.copyfile(kernels[-1], work / "vmlinuz")
    shutil.copyfile(initrds[-1], work / "initrd.img")
    log("vm image: mkfs.ext4 -d, then qcow2")
    _run(["mkfs.ext4", "-q", "-L", "root", "-d", str(tree), str(work / "root.raw"), IMAGE_SIZE], work / "mkfs.log")
    _run(["qemu-img", "convert", "-O", "qcow2", str(work / "root.raw"), str(work / "base.qcow2")], work / "mkfs.log")
    (work / "root.raw").unlink()


def _run(argv: list[str], log_file: Path) -> None:
    with open(log_file, "a") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"})
    if proc.returncode != 0:
        tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise FatpipeError(f"vm image: `{argv[0]}` failed ({proc.returncode}): {tail[0]}")


@contextlib.contextmanager
def locked(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
