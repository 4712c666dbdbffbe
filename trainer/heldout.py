"""The eval loss: the model on the validation split, or else on the held-out windows
(`data.split_windows`), never trained on."""

from __future__ import annotations

import torch

from .data import Corpus, Windows, split_windows
from .torchstate import autocast, fork_rng


def heldout_windows(train: Corpus, val: Corpus | None, seq_len: int) -> tuple[Windows, range]:
    """The windows the eval loss reads: the validation split's first ones when the data ships
    one (training then used every training window), else the training corpus's held-out tail."""
    if val is not None:
        windows = Windows(val, seq_len)
        return windows, range(windows.count)
    windows = Windows(train, seq_len)
    return windows, split_windows(windows.count)[1]


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, windows: Windows, held: range, batch_size: int,
                 device: torch.device, count: int) -> tuple[float, int]:
    """(mean loss per window, windows evaluated) of `model` on the first `count` windows `held`
    of `windows` (`--eval-windows`), in order: the same ones for every run of a corpus and
    seq_len, whatever the world size or batch size."""
    ids = list(held[:count])
    total = 0.0
    was_training = model.training
    model.eval()
    with fork_rng(device):
        for start in range(0, len(ids), batch_size):
            rows = ids[start:start + batch_size]
            chunk = torch.stack([windows.window(w) for w in rows]).to(device)
            with autocast(device):
                _, loss = model(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous())
            total += float(loss) * len(rows)  # equal windows: the batch mean, weighted by rows
    model.train(was_training)
    return total / max(len(ids), 1), len(ids)
