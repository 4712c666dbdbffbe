"""The distributed environment, read from torchrun's variables in this one place.

Run alone (no RANK / WORLD_SIZE), the trainer still makes a one-process group on an
in-memory store, so DDP, the comm hooks and the metrics take the same code path.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

STORE_PREFIX = "fatpipe"  # every key the trainer keeps in the run-wide store starts with this


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    restarts: int  # how many times the worker group has restarted; the same on every rank
    device: torch.device
    backend: str  # nccl on CUDA, gloo on CPU

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def attempt(self) -> int:
        """1 for the group's first attempt, n + 1 after its n-th restart."""
        return self.restarts + 1


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
        # Per agent, so not agreed across nodes: init_process_group replaces it under torchrun.
        restarts=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        device=device,
        backend=backend,
    )


def join_counter(store: dist.Store, rank: int) -> int:
    """How many times a worker of global rank `rank` has joined this run's store, this one included.

    torchrun restarts the whole worker group on a new rendezvous round: every node's agent stops
    its workers and starts one worker per global rank, so after n restarts every rank's count is
    n + 1. TORCHELASTIC_RESTART_COUNT is not agreed: an agent whose own workers failed counts a
    restart, one restarted for the membership change does not.
    """
    return int(store.add(f"{STORE_PREFIX}/joins/{rank}", 1))


def init_process_group(env: DistEnv, timeout_s: float) -> tuple[DistEnv, dist.Store]:
    """Join the group; a peer that never arrives or dies fails us after `timeout_s`.

    Returns the environment with the agreed restart count, and the run-wide store (it outlives
    an attempt under torchrun) where the trainer keeps its counters.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store across restarts, and after a restart gloo read the
        # killed attempt's addresses from it ("connectFullMesh failed ... Connection refused"
        # on torch 2.13). A key prefix per attempt keeps each attempt's rendezvous apart; the
        # attempt number must be the same on every rank (join_counter), or the group never forms.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              env.world_size, is_master=False, timeout=timeout)
        env = dataclasses.replace(env, restarts=join_counter(store, env.rank) - 1)
        dist.init_process_group(env.backend, store=dist.PrefixStore(
            f"{STORE_PREFIX}/attempt-{env.attempt}", store), rank=env.rank,
            world_size=env.world_size, timeout=timeout)
        return env, store
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(env.backend, timeout=timeout)
        return env, dist.distributed_c10d._get_default_store()
    store = dist.HashStore()
    dist.init_process_group(env.backend, store=store, rank=0, world_size=1, timeout=timeout)
    return env, store


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
