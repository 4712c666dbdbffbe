"""`python -m fatpipe.trainer`: parse flags, join the process group, train, tear down."""

from __future__ import annotations

import logging
import sys

from .config import ConfigError, parse_config
from .nodelog import log_to_stderr


def main(argv: list[str] | None = None) -> int:
    from .noderank import record_group_rank

    record_group_rank()  # before anything can fail: which node is rank 0's (ops.run.leader)
    try:
        cfg = parse_config(argv)
        # Imported after parsing so a bad flag fails fast, before torch loads.
        from .data import load_data
        cfg, data = load_data(cfg)  # a bad shard fails here, before joining the group
    except ConfigError as e:
        _error(e)
        from .exiting import record_error

        record_error(e)  # under torchrun: the cause the launcher names (loads torch, only here)
        return 2
    from .distenv import destroy_process_group, init_process_group, read_env
    from .train import run_training

    if cfg.fault_tolerance == "live":
        from .livetrain import run_live_training as run_training

    env = read_env()
    log_to_stderr(env.rank, logging.INFO if env.is_main else logging.WARNING)
    env, store = init_process_group(env, cfg.timeout_s)
    try:
        run_training(cfg, env, store, data)
    except ConfigError as e:  # found once the data is read: another node's data, ids past the
        return _error(e)      # vocabulary, a resume refused
    finally:
        destroy_process_group()
    return 0


def _error(e: ConfigError) -> int:
    print(f"python -m fatpipe.trainer: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    from .exiting import run_and_exit

    run_and_exit(main)
