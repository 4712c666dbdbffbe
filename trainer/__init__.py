"""The torchrun entry point: GPT model, data, DDP with comm hooks, checkpoints and metrics."""
