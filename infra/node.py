"""What fatpipe writes on a node, by path: the node profile writes these files, `fatpipe wait` reads them."""

SYSCTL_FILE = "/etc/sysctl.d/60-fatpipe.conf"
MODULES_FILE = "/etc/modules-load.d/fatpipe.conf"
NCCL_CONF = "/etc/nccl.conf"
NET_ENV = "/etc/fatpipe/net.env"
NET_SCRIPT = "/usr/local/sbin/fatpipe-net"
READY_SCRIPT = "/usr/local/sbin/fatpipe-ready"
# The ready marker: JSON with the values read back from the kernel, written last at boot.
READY_FILE = "/var/lib/fatpipe/ready"
UNIT = "fatpipe-net.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
