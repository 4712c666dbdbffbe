"""Per-process torch state the trainer sets, forks and restores: determinism, autocast, RNG."""

from __future__ import annotations

import contextlib
import os
import random

import torch


def configure_determinism(on: bool, device: torch.device) -> None:
    if not on:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic cuBLAS
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def fork_rng(device: torch.device):
    """Run measurement steps without moving any RNG stream the real steps use."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
