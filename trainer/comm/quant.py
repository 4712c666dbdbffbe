"""int8 with a scale per chunk and error feedback: what crosses between regions (docs/ARCHITECTURE.md,
"Regions").

Each chunk of CHUNK values is sent as int8 (round to nearest of value / scale, scale = the
chunk's largest magnitude / 127) and one float32 scale: 1.001 bytes a value instead of 4. What
rounding dropped is kept (`ErrorFeedback`) and added to the next exchange, so it is delayed, not
lost (INTELLECT-1 sent its pseudo-gradients as int8 this way). Plain torch ops: gloo on CPU
sends the int8 bytes as they are, unlike torchft's Triton-only quantized all-reduce.
"""

from __future__ import annotations

import torch

CHUNK = 4096
_LEVELS = 127


def quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale per chunk) of a 1-D float tensor."""
    pad = (-values.numel()) % CHUNK
    chunks = torch.nn.functional.pad(values.float(), (0, pad)).view(-1, CHUNK)
    scales = chunks.abs().amax(dim=1) / _LEVELS
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(chunks / safe[:, None]).clamp_(-_LEVELS, _LEVELS).to(torch.int8)
    return q.view(-1)[:values.numel()].clone(), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    pad = (-q.numel()) % CHUNK
    chunks = torch.nn.functional.pad(q.float(), (0, pad)).view(-1, CHUNK)
    return (chunks * scales[:, None]).view(-1)[:q.numel()]


def wire_bytes(numel: int) -> int:
    """Bytes one quantized tensor of `numel` values takes: the values and the scales."""
    return numel + 4 * -(-numel // CHUNK)


class ErrorFeedback:
    """Quantizes a tensor after adding what the previous quantization of it dropped."""

    def __init__(self):
        self.residual: torch.Tensor | None = None

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        target = values.float() + (self.residual if self.residual is not None else 0)
        q, scales = quantize(target)
        self.residual = target - dequantize(q, scales)
        return q, scales

    def state_dict(self) -> dict:
        return {"residual": None if self.residual is None else self.residual.cpu().clone()}

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        saved = state.get("residual")
        self.residual = None if saved is None else saved.to(device)
