"""The eval loss: the model on the held-out windows (`data.split_windows`), never trained on."""

from __future__ import annotations

import torch

from .data import split_windows
from .torchstate import autocast, fork_rng

# The first held-out windows that are evaluated, in order: the same ones for every run of a
# corpus and seq_len, whatever the world size or batch size.
EVAL_WINDOWS = 128


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, tokens: torch.Tensor, seq_len: int, batch_size: int,
                 device: torch.device) -> tuple[float, int]:
    """(mean loss per window, windows evaluated) of `model` on the held-out windows."""
    _, held = split_windows((len(tokens) - 1) // seq_len)
    ids = torch.tensor(held[:EVAL_WINDOWS], dtype=torch.long)
    offsets = torch.arange(seq_len + 1)
    total = 0.0
    was_training = model.training
    model.eval()
    with fork_rng(device):
        for start in range(0, len(ids), batch_size):
            rows = ids[start:start + batch_size]
            chunk = tokens[rows[:, None] * seq_len + offsets].long().to(device)
            with autocast(device):
                _, loss = model(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous())
            total += float(loss) * len(rows)  # equal windows: the batch mean, weighted by rows
    model.train(was_training)
    return total / max(len(ids), 1), len(ids)
