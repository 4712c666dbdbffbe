"""What the vm stack's provisioners hand `fatpipe vm node-up/node-down`: each node input as
FATPIPE_VM_<KEY> in the environment. The stack (providers/vm_stack, which loads the CDK) and the
command (cli/vm, which must not) both read the names here."""

from __future__ import annotations

# What only booting needs goes to node-up alone: a node deployed before such a key existed can
# still be destroyed.
NODE_KEYS = ("name", "address", "mac", "rate_gbit", "mtu", "node_dir", "bridge", "tap", "accel",
             "vcpus", "memory_mib", "cache")
BOOT_KEYS = ("wheels", "rtt_ms", "peer_rtt_ms", "user_data")  # the user data last
# Boot keys only a cluster with `cross_region_gbps` has: absent elsewhere, so other stacks (and
# the VMs they replace on a change) stay as they were.
RATE_KEYS = ("peer_gbps",)
VM_ENV_PREFIX = "FATPIPE_VM_"
