"""Broadcast and gather of small Python objects over the process group, needing torch only.

torch.distributed's `*_object*` collectives convert through numpy, which torch does not
install and the nodes' venvs may lack; these pickle into a uint8 tensor instead. The payload
is pickled by peers of the same job, the same trust torch's versions assume.
"""

from __future__ import annotations

import ctypes
import pickle

import torch
import torch.distributed as dist

from .faults import ISSUED


def _encode(obj, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)


def _decode(t: torch.Tensor):
    cpu = t.cpu().contiguous()
    if cpu.numel() == 0:
        raise ValueError("empty object payload")
    return pickle.loads(bytes((ctypes.c_char * cpu.numel()).from_address(cpu.data_ptr())))


def _sizes(n: int, device: torch.device) -> list[int]:
    mine = torch.tensor([n], dtype=torch.long, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    ISSUED.add()
    dist.all_gather(every, mine)
    return [int(s.item()) for s in every]


def _padded(obj, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """`obj` pickled and zero-padded to the largest rank's size, and every rank's size."""
    payload = _encode(obj, device)
    sizes = _sizes(payload.numel(), device)
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[:payload.numel()] = payload
    return padded, sizes


def broadcast_object(obj, src: int, device: torch.device):
    """`obj` of rank `src`, on every rank."""
    payload = _encode(obj, device) if dist.get_rank() == src else None
    size = torch.tensor([payload.numel() if payload is not None else 0], device=device)
    ISSUED.add()
    dist.broadcast(size, src)
    if payload is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    ISSUED.add()
    dist.broadcast(payload, src)
    return obj if dist.get_rank() == src else _decode(payload)


def all_gather_objects(obj, device: torch.device) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    padded, sizes = _padded(obj, device)
    every = [torch.empty_like(padded) for _ in sizes]
    ISSUED.add()
    dist.all_gather(every, padded)
    return [_decode(t[:n]) for t, n in zip(every, sizes, strict=True)]


def broadcast_flag(flag: bool | None, src: int, device: torch.device) -> bool:
    """Rank `src`'s `flag` on every rank: one broadcast of one integer (the others pass None)."""
    t = torch.tensor([int(bool(flag))], dtype=torch.int32, device=device)
    ISSUED.add()
    dist.broadcast(t, src)
    return bool(t.item())
