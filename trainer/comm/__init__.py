"""The communication layer: the timed DDP comm hook, comm=auto, hook costs, re-decision, periodic methods."""
