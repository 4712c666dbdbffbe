"""What fatpipe writes on a node, by path: the node profile's files (`fatpipe wait` reads them) and
the project folder that runs ship to, with the rule a project folder's path must follow."""

from pathlib import PurePosixPath

SYSCTL_FILE = "/etc/sysctl.d/60-fatpipe.conf"
MODULES_FILE = "/etc/modules-load.d/fatpipe.conf"
NCCL_CONF = "/etc/nccl.conf"
NET_ENV = "/etc/fatpipe/net.env"
NET_SCRIPT = "/usr/local/sbin/fatpipe-net"
READY_SCRIPT = "/usr/local/sbin/fatpipe-ready"
# The ready marker: JSON with the values read back from the kernel, written last at boot.
READY_FILE = "/var/lib/fatpipe/ready"
SYSCTL_APPLY_FILE = "/var/lib/fatpipe/sysctl-apply.json"  # over SSH: what the kernel took
RESTORE_FILE = "/var/lib/fatpipe/restore.json"  # over SSH: what the machine had before
UNIT = "fatpipe-net.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"

# The project folder on an ssh node (relative to the login user's home; $FATPIPE_REMOTE_DIR
# overrides it), and what fatpipe keeps inside it.
DEFAULT_REMOTE_DIR = "fatpipe/{cluster}"
REMOTE_VENV = ".fatpipe/venv"  # the venv holding torch, unless --remote-python names one
REMOTE_PKG = ".fatpipe/pkg"  # the built-in trainer, shipped as fatpipe/trainer on PYTHONPATH
# fatpipe's mark in a project folder it made (the cluster's name, then the project's id): only a
# folder that carries this project's is pushed into and removed by `down` (docs/ARCHITECTURE.md,
# "The project folder on a node").
PROJECT_MARKER = ".fatpipe-project"
PUSH_RECORD = ".fatpipe/pushed.json"  # what the project's pushes sent, so a push deletes only that
# An absolute project folder must lie below a folder of this name: no system folder has it.
ABSOLUTE_PARENT = "fatpipe"


def remote_dir_problem(value: str) -> str | None:
    """Why `value` cannot be a project folder on a node (None: it can).

    Relative (to the login's home) without `..`, naming a folder below the home; or absolute
    below a folder named `fatpipe` (`/mnt/nvme/fatpipe/lab`). So never the home, `/`, `/srv`.
    """
    rule = ("a folder relative to the login's home without '..' (fatpipe/lab), "
            f"or an absolute one below a folder named {ABSOLUTE_PARENT!r} (/mnt/nvme/fatpipe/lab)")
    if not value.strip() or any(not ch.isprintable() for ch in value):
        return f"{value!r} is not a folder name; use {rule}"
    path = PurePosixPath(value)
    if ".." in path.parts:
        return f"{value!r} contains '..'; use {rule}"
    if value.startswith("~"):
        return f"{value!r} starts with '~', which is not expanded; use {rule}"
    if value.startswith("-"):
        return f"{value!r} starts with '-', which reads as an option; use {rule}"
    if not path.is_absolute():
        if path.parts == (ABSOLUTE_PARENT,):  # every cluster's default folder lies below it
            return f"{value!r} holds every cluster's default folder; use one below it (fatpipe/lab)"
        return None if path.parts else f"{value!r} is the login's home itself; use {rule}"
    if ABSOLUTE_PARENT not in path.parts[1:-1]:
        return f"{value!r} is an absolute folder not below one named {ABSOLUTE_PARENT!r}; use {rule}"
    return None
