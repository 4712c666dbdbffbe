"""Each rank's data, checked against every other rank's, and its stream opened where the
checkpoint left it (`resume`).

The shards are a partition of one corpus only if every rank holds the same one; the default
corpus is each node's own Python standard library, which differs between Python versions. So
before the first step every rank gathers every rank's data size and fingerprint, and the run
fails naming the node whose data differs.
"""

from __future__ import annotations

import hashlib
import logging
import socket

import torch

from fatpipe.node.env import NodeEnv

from .collectives import all_gather_objects
from .config import ConfigError, TrainConfig
from .data import Corpus, ShardedBatches, check_token_ids, fingerprint
from .distenv import DistEnv
from .resume import DataLayout, resume_cursor

log = logging.getLogger(__name__)


class DataMismatch(ConfigError):
    """Ranks hold different data."""


def node_name() -> str:
    return NodeEnv.from_environ().node_name or socket.gethostname()


def data_bytes(corpus: Corpus) -> int:
    return sum(s.tokens.numel() * s.tokens.element_size() for s in corpus.shards)


def corpus_fingerprint(corpus: Corpus) -> str:
    """data.fingerprint of a one-shard corpus (text as bytes); of several, the sha256 of their
    fingerprints in order."""
    digests = [fingerprint(s.tokens) for s in corpus.shards]
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()


def check_same_data(corpus: Corpus, device: torch.device) -> str:
    """Collective: this data's fingerprint, once every rank is known to hold the same data;
    else DataMismatch naming each node whose data is not rank 0's."""
    mine = {"node": node_name(), "bytes": data_bytes(corpus),
            "fingerprint": corpus_fingerprint(corpus)}
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


def open_data(cfg: TrainConfig, env: DistEnv, ckpt: dict | None,
              data: tuple[Corpus, Corpus | None]) -> tuple[ShardedBatches, DataLayout]:
    """Collective: this rank's batches over the training corpus of `data` (train, validation;
    `data.load_data`), at the checkpoint's position carried to this run's layout
    (`resume.resume_cursor`: remapped and said, or refused), and the layout. Without a
    validation split the last windows are held out (`data.split_windows`)."""
    train, val = data
    digest = check_same_data(train, env.device)
    check_token_ids(data, env.rank, env.world_size, env.device)
    batches = ShardedBatches(train, cfg.seq_len, cfg.batch_size, env.rank, env.world_size,
                             cfg.seed, holdout=val is None)
    layout = DataLayout.of(cfg, env.world_size, batches.train_windows, digest, data_bytes(train))
    batches.cursor, remapped = resume_cursor(ckpt, layout)
    if remapped and env.is_main:
        log.warning("%s", remapped)
    return batches, layout
