"""int8 with a scale per chunk and error feedback: what crosses between regions (docs/ARCHITECTURE.md,
"Regions").

Each chunk of CHUNK values is sent as int8 (round to nearest of value / scale, scale = the
chunk's largest magnitude / 127) and one float32 scale: 1.001 bytes a value instead of 4. What
rounding dropped is kept (`ErrorFeedback`) and added to the next exchange, so it is delayed, not
lost (INTELLECT-1 sent its pseudo-gradients as int8 this way). Plain torch ops: gloo on CPU
sends the int8 bytes as they are, unlike torchft's Triton-only quantized all-reduce.

A chunk holding a value that is not finite (a NaN or inf in the pseudo-gradient) has a scale that
is not finite: it is sent as zeros with that scale, which every receiver reads as "dropped"
(`kept_chunks`), so the chunk counts zero from every region alike, decided from the exchanged
scales on every rank without a collective of its own; and its residual is dropped, so one bad
value is not carried into every later exchange (and into checkpoints).
"""

from __future__ import annotations

import torch

from .costmodel import CHUNK  # the bytes it sends are priced there: `int8_wire_bytes`

_LEVELS = 127


def quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale per chunk) of a 1-D float tensor."""
    pad = (-values.numel()) % CHUNK
    chunks = torch.nn.functional.pad(values.float(), (0, pad)).view(-1, CHUNK)
    scales = chunks.abs().amax(dim=1) / _LEVELS  # NaN or inf where a value is not finite
    finite = torch.isfinite(scales)
    safe = torch.where(finite & (scales > 0), scales, torch.ones_like(scales))
    q = torch.round(chunks / safe[:, None]).clamp_(-_LEVELS, _LEVELS).to(torch.int8)
    q[~finite] = 0  # a chunk that is not finite is sent as zeros
    return q.view(-1)[:values.numel()].clone(), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The values of `q`; a chunk whose scale is not finite reads as zeros."""
    pad = (-q.numel()) % CHUNK
    chunks = torch.nn.functional.pad(q.float(), (0, pad)).view(-1, CHUNK)
    scales = torch.where(torch.isfinite(scales), scales, torch.zeros_like(scales))
    return (chunks * scales[:, None]).view(-1)[:q.numel()]


def kept_chunks(every_scales: list[torch.Tensor]) -> torch.Tensor:
    """Which chunks every region sent finite (one bool a chunk): the same on every rank that
    holds the same gathered scales. A chunk dropped anywhere counts zero from every region."""
    return torch.isfinite(torch.stack(every_scales)).all(dim=0)


class ErrorFeedback:
    """Quantizes a tensor after adding what the previous quantization of it dropped."""

    def __init__(self):
        self.residual: torch.Tensor | None = None

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        target = values.float() + (self.residual if self.residual is not None else 0)
        q, scales = quantize(target)
        self.residual = target - dequantize(q, scales)
        self.drop(~torch.isfinite(scales))
        return q, scales

    def drop(self, chunks: torch.Tensor) -> None:
        """Forget what is kept back for the chunks marked True: they were not sent (or not
        summed), so what rounding dropped from them has nothing to follow."""
        if self.residual is None or not bool(chunks.any()):
            return
        mask = chunks.repeat_interleave(CHUNK)[:self.residual.numel()]
        self.residual[mask] = 0

    def state_dict(self) -> dict:
        return {"residual": None if self.residual is None else self.residual.cpu().clone()}

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        saved = state.get("residual")
        self.residual = None if saved is None else saved.to(device)
