"""The group rank torchrun's rendezvous gave this node, written where fatpipe reads it.

torch's c10d rendezvous orders the nodes itself (by their `--local-addr` as a string), so the
node that runs rank 0, where metrics, summaries, checkpoints and a script's outputs land, need
not be the cluster's node 0. The launch path names the file in FATPIPE_GROUP_RANK_FILE; the
worker of local rank 0 writes GROUP_RANK there as it starts, every attempt
(docs/ARCHITECTURE.md, "Rendezvous"). Without the variable (plain torchrun) nothing is written.
"""

from __future__ import annotations

import os

from fatpipe.node.env import GROUP_RANK_FILE


def record_group_rank(env: dict[str, str] | None = None) -> None:
    env = os.environ if env is None else env
    path, group_rank = env.get(GROUP_RANK_FILE), env.get("GROUP_RANK")
    if not path or group_rank is None or env.get("LOCAL_RANK", "0") != "0":
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(f"{int(group_rank)}\n")
        os.replace(tmp, path)  # read whole, never half written
    except (OSError, ValueError):
        # A record fatpipe cannot write costs only its reading of the leader (it falls back on
        # the rendezvous plan), never the run.
        try:
            os.unlink(tmp)
        except OSError:
            pass
