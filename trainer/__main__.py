"""`python -m fatpipe.trainer`: parse flags, join the process group, train, tear down."""

from __future__ import annotations

import logging
import sys

from .config import ConfigError, parse_config
from .exiting import record_error, run_and_exit
from .lazy import load
from .nodelog import log_to_stderr
from .noderank import record_group_rank


def main(argv: list[str] | None = None) -> int:
    record_group_rank()  # before anything can fail: which node is rank 0's (ops.run.leader)
    try:
        cfg = parse_config(argv)
        # Loaded after parsing so a bad flag fails fast, before torch loads.
        cfg, data = load("fatpipe.trainer.data").load_data(cfg)  # a bad shard fails here, before joining the group
    except ConfigError as e:
        _error(e)
        record_error(e)  # under torchrun: the cause the launcher names (loads torch, only here)
        return 2
    distenv = load("fatpipe.trainer.distenv")
    if cfg.fault_tolerance == "live":
        run_training = load("fatpipe.trainer.livetrain").run_live_training
    else:
        run_training = load("fatpipe.trainer.train").run_training

    env = distenv.read_env()
    log_to_stderr(env.rank, logging.INFO if env.is_main else logging.WARNING)
    env, store = distenv.init_process_group(env, cfg.timeout_s)
    try:
        run_training(cfg, env, store, data)
    except ConfigError as e:  # found once the data is read: another node's data, ids past the
        return _error(e)      # vocabulary, a resume refused
    finally:
        distenv.destroy_process_group()
    return 0


def _error(e: ConfigError) -> int:
    print(f"python -m fatpipe.trainer: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    run_and_exit(main)
