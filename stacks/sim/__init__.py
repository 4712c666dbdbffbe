"""The sim provider's local emulator: network namespaces, veths, bridges and tc shaping; only
the sim provider (stacks/providers/sim*.py) and the sim commands reach it (docs/ARCHITECTURE.md)."""
