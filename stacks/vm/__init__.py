"""The vm provider's local emulator: QEMU guests from a cached base image, their seed and wheel
disk; only the vm provider (stacks/providers/vm*.py) and the vm commands reach it
(docs/local-vms.md)."""
