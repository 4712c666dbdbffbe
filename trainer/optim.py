"""AdamW with decoupled weight decay on matrices only, and a warmup + cosine LR schedule."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
MIN_LR_RATIO = 0.1  # cosine decays to lr / 10


def build_optimizer(model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    # Decay weight matrices and embeddings; leave norms and biases alone (GPT-2 practice).
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, fused=device.type == "cuda")


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the peak LR for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int,
                    total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, lambda s: lr_factor(s, warmup_steps, total_steps))
