"""A digest of a model's parameters and buffers, to check that DDP replicas stayed identical."""

from __future__ import annotations

import ctypes
import hashlib

import torch


def param_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter and buffer's bytes: equal digests mean identical replicas."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        flat = t.detach().cpu().contiguous()
        # The tensor's memory as a buffer, without numpy (node venvs may lack it); `flat`
        # stays alive while the view is hashed.
        h.update((ctypes.c_char * (flat.numel() * flat.element_size())).from_address(
            flat.data_ptr()))
    return h.hexdigest()
