"""Each rank's data, checked against every other rank's, and its stream opened where the
checkpoint left it (`resume`).

The shards are a partition of one corpus only if every rank holds the same one; the default
corpus is each node's own Python standard library, which differs between Python versions. So
before the first step every rank gathers every rank's data size and fingerprint, and the run
fails naming the node whose data differs.
"""

from __future__ import annotations

import logging
import os
import socket

import torch

from .collectives import all_gather_objects
from .config import ConfigError, TrainConfig
from .data import ShardedBatches, fingerprint, load_corpus, split_windows
from .distenv import DistEnv
from .faults import NODE_ENV
from .resume import DataLayout, resume_cursor

log = logging.getLogger(__name__)


class DataMismatch(ConfigError):
    """Ranks hold different data."""


def node_name() -> str:
    return os.environ.get(NODE_ENV) or socket.gethostname()


def data_bytes(tokens: torch.Tensor) -> int:
    return tokens.numel() * tokens.element_size()


def check_same_data(tokens: torch.Tensor, device: torch.device) -> str:
    """Collective: this data's fingerprint, once every rank is known to hold the same data;
    else DataMismatch naming each node whose data is not rank 0's."""
    mine = {"node": node_name(), "bytes": data_bytes(tokens), "fingerprint": fingerprint(tokens)}
    every = all_gather_objects(mine, device)
    first = every[0]
    odd = [f"node {d['node']} (rank {r}) has {d['bytes']} bytes, fingerprint "
           f"{d['fingerprint'][:12]}" for r, d in enumerate(every)
           if (d["bytes"], d["fingerprint"]) != (first["bytes"], first["fingerprint"])]
    if odd:
        raise DataMismatch(
            f"the data differs across nodes: {'; '.join(odd)}; node {first['node']} (rank 0) has "
            f"{first['bytes']} bytes, fingerprint {first['fingerprint'][:12]}: give every node "
            f"the same --data (the default corpus is each node's own Python standard library)")
    return first["fingerprint"]


def open_data(cfg: TrainConfig, env: DistEnv, ckpt: dict | None) -> tuple[ShardedBatches,
                                                                          DataLayout]:
    """Collective: this rank's batches, at the checkpoint's position carried to this run's
    layout (`resume.resume_cursor`: remapped and said, or refused), and the layout."""
    tokens = load_corpus(cfg.data)
    digest = check_same_data(tokens, env.device)
    windows, _ = split_windows((len(tokens) - 1) // cfg.seq_len)
    layout = DataLayout.of(cfg, env.world_size, windows, digest, data_bytes(tokens))
    cursor, remapped = resume_cursor(ckpt, layout)
    if remapped and env.is_main:
        log.warning("%s", remapped)
    batches = ShardedBatches(tokens, cfg.seq_len, cfg.batch_size, env.rank, env.world_size,
                             cfg.seed, cursor)
    return batches, layout
