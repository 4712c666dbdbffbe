"""The distributed environment, read from torchrun's variables in this one place.

Run alone (no RANK / WORLD_SIZE), the trainer still makes a one-process group on an
in-memory store, so DDP, the comm hooks and the metrics take the same code path.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    restarts: int  # how many times torchrun has restarted the worker group
    device: torch.device
    backend: str  # nccl on CUDA, gloo on CPU

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env(env: dict[str, str] | None = None) -> DistEnv:
    env = os.environ if env is None else env
    local_rank = int(env.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    return DistEnv(
        rank=int(env.get("RANK", 0)),
        local_rank=local_rank,
        world_size=int(env.get("WORLD_SIZE", 1)),
        restarts=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        device=device,
        backend=backend,
    )


def init_process_group(env: DistEnv, timeout_s: float) -> None:
    """Join the group; a peer that never arrives or dies fails us after `timeout_s`."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store across restarts, and after a restart gloo read the
        # killed attempt's addresses from it ("connectFullMesh failed ... Connection refused"
        # on torch 2.13). A key prefix per attempt keeps each attempt's rendezvous apart.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              env.world_size, is_master=False, timeout=timeout)
        store = dist.PrefixStore(f"fatpipe/attempt-{env.restarts}", store)
        dist.init_process_group(env.backend, store=store, rank=env.rank,
                                world_size=env.world_size, timeout=timeout)
    elif "MASTER_ADDR" in os.environ:
        dist.init_process_group(env.backend, timeout=timeout)
    else:
        dist.init_process_group(env.backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
