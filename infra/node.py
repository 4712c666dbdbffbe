"""What fatpipe writes on a node, by path: the node profile's files (`fatpipe wait` reads them) and
the project folder that runs ship to."""

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
