"""fatpipe for your own DDP script: the run's comm choice and its measurements, in three lines.

    import fatpipe.trainer.api as fatpipe
    model = fatpipe.wrap(model)                    # instead of DistributedDataParallel(model, ...)
    fatpipe.step(loss, tokens=x.numel())           # every step, after optimizer.step()

Under `fault_tolerance = "live"` (torchft; each node one replica group) a fourth line wraps the
optimizer, whose step() then steps only when the quorum commits, and the script loops on the
run's committed steps and reads its data by its shard (`livescript` says why):

    optimizer = fatpipe.optimizer(optimizer)       # 4: optionally with its scheduler
    while fatpipe.steps_done() < steps: ...        # and fatpipe.data_shard() for the sampler

`wrap` returns torch's own DistributedDataParallel with one comm hook registered (or `attach`
registers it on a DDP model you built): the comm the run asks for (`[train] comm`, `--comm`),
comm=auto's choice from the run's netcheck.json and the script's own first steps (re-decided mid-run
when the steps drift off its prediction: `comm.redecide`), or a named hook. The periodic methods
(diloco, localsgd) change what the optimizer step means, so they run only with
`allow_periodic=True`. `step` records the step into the run folder as the built-in trainer does
(metrics.jsonl, nodes.jsonl, events.jsonl, faults.json; summary.json at the end), which `fatpipe
top`, `fatpipe report` and the run's summary read.

The run is found through what `fatpipe launch` puts in every node's environment
(FATPIPE_RUN_DIR, FATPIPE_TRAIN_ARGS: ops.rdzv.rendezvous). Outside fatpipe (plain torchrun) `wrap`
is plain DDP and `step` records nothing, unless `run_dir` names a folder to record into; in one
process without a process group `wrap` returns the model as it is.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import logging
import operator
import os
import shlex
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# The script API's names for the run's variables (fatpipe.node.env defines them).
from fatpipe.node.env import RUN_DIR as RUN_DIR_ENV
from fatpipe.node.env import TRAIN_ARGS as TRAIN_ARGS_ENV

from ..comm.hooks import powersgd_available
from ..config import TrainConfig, build_parser
from ..distenv import DistEnv, join_counter, read_env
from ..distenv import init_process_group as join_group
from ..live.manager import settings_from_env
from .ddpcomm import one_bucket_cap_mb
from .livescript import live_config
from .runoptimizer import RunOptimizer
from .scriptrun import ScriptRun

log = logging.getLogger(__name__)
_run: ScriptRun | None = None
_steps_outside = 0  # step() calls outside a fatpipe run
_group: tuple[DistEnv, dist.Store] | None = None  # from init_process_group, when the script used it
_wrapped = False  # wrap() or attach() was called
_stateful: list = []  # what fatpipe.optimizer() was given: a returning node is sent it under live


def init_process_group(timeout_s: float = 1800.0) -> None:
    """Optional, instead of dist.init_process_group(): the trainer's own join
    (`distenv.init_process_group`), which keeps each torchrun attempt's rendezvous apart, so the
    group forms again after a restart (a plain init may read the killed attempt's addresses)."""
    global _group
    _group = join_group(read_env(), timeout_s)


def run_config(run_dir: str | os.PathLike | None = None, steps: int | None = None,
               comm: str | None = None, environ: dict[str, str] | None = None) -> TrainConfig | None:
    """The run's settings from the node's environment (or `run_dir`); None outside a run."""
    environ = os.environ if environ is None else environ
    folder = run_dir or environ.get(RUN_DIR_ENV)
    if not folder:
        return None
    args = vars(build_parser().parse_args(shlex.split(environ.get(TRAIN_ARGS_ENV, ""))))
    # `data` names the built-in trainer's corpus: a script reads its own.
    args |= {"data": None, "out": str(folder)}
    args |= {k: v for k, v in (("steps", steps), ("comm", comm)) if v is not None}
    return TrainConfig(**args)


def _dist_env(device: torch.device) -> DistEnv:
    return DistEnv(rank=dist.get_rank(), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                   world_size=dist.get_world_size(),
                   restarts=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                   device=device, backend=dist.get_backend())


def wrap(model: torch.nn.Module, *, allow_periodic: bool = False, steps: int | None = None,
         comm: str | None = None, run_dir: str | os.PathLike | None = None, **ddp_kwargs):
    """`model` in torch's DDP with the run's comm hook; `ddp_kwargs` go to DDP as they are.

    `steps` (the script's optimizer steps, when known) makes the last step close the periodic
    methods' and the node metrics' last interval; `comm` overrides the run's choice.
    """
    global _wrapped
    cfg, _wrapped = run_config(run_dir, steps, comm), True
    if not dist.is_initialized():
        if cfg is not None and os.environ.get("WORLD_SIZE"):  # torchrun started it: a group is due
            raise RuntimeError("fatpipe.wrap(model) needs the process group: call "
                               "dist.init_process_group() (or fatpipe.init_process_group()) first")
        return model  # one process: nothing to synchronise
    device = next(model.parameters()).device
    if device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [device.index])
    if cfg is None:
        return DDP(model, **ddp_kwargs)
    if "bucket_cap_mb" not in ddp_kwargs:
        cap = cfg.bucket_cap_mb
        if (dist.get_backend() == "gloo" and cfg.comm in ("auto", "powersgd")
                and powersgd_available()):
            cap = one_bucket_cap_mb(model)  # PowerSGD on gloo: one bucket
        ddp_kwargs["bucket_cap_mb"] = cap
    if cfg.fault_tolerance == "live":  # the bucket layout of every process's first step kept
        ddp_kwargs.setdefault("find_unused_parameters", True)  # (api.livescript says why)
    cfg = dataclasses.replace(cfg, bucket_cap_mb=ddp_kwargs["bucket_cap_mb"])
    ddp_kwargs.setdefault("gradient_as_bucket_view", True)
    return _start(cfg, DDP(model, **ddp_kwargs), allow_periodic, steps is not None)


def attach(ddp_model: DDP, *, allow_periodic: bool = False, steps: int | None = None,
           comm: str | None = None, run_dir: str | os.PathLike | None = None) -> DDP:
    """Register the run's comm hook on a DDP model the script built (before its first step)."""
    global _wrapped
    cfg, _wrapped = run_config(run_dir, steps, comm), True
    if cfg is None:
        return ddp_model
    cfg = dataclasses.replace(cfg, bucket_cap_mb=ddp_model.bucket_bytes_cap / 2**20)
    return _start(cfg, ddp_model, allow_periodic, steps is not None)


def _run_store(env: DistEnv, timeout_s: float) -> tuple[DistEnv, dist.Store]:
    """The run-wide store, where fault counts outlive an attempt, and the attempt agreed by all.

    Under torchrun that is the agent's store, reached as `distenv.init_process_group` reaches
    it (the default group's store is the same one under the group's own prefix), and the attempt
    is counted there: TORCHELASTIC_RESTART_COUNT is per node, not agreed (`distenv.join_counter`).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return env, dist.distributed_c10d._get_default_store()
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          env.world_size, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    return dataclasses.replace(env, restarts=join_counter(store, env.rank) - 1), store


def _start(cfg: TrainConfig, ddp: DDP, allow_periodic: bool, steps_given: bool) -> DDP:
    global _run
    if _run is not None:
        raise RuntimeError("fatpipe measures one DDP model per process: wrap() was called before")
    env, store = _group or _run_store(_dist_env(next(ddp.module.parameters()).device),
                                      cfg.timeout_s)
    if cfg.fault_tolerance == "live":
        cfg = live_config(cfg)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if env.is_main and not logging.getLogger().handlers and not log.parent.handlers:
        log.parent.addHandler(logging.StreamHandler(sys.stderr))  # the comm decision's lines
        log.parent.setLevel(logging.INFO)
    _run = ScriptRun(cfg, env, store, ddp, allow_periodic, steps_given)
    if _run.live is not None:
        _run.live.stateful[:] = _stateful  # fatpipe.optimizer() may have come first
    atexit.register(finish)
    _previous_hook = sys.excepthook

    def record_failure(kind, error, tb):
        if _run is not None:  # no summary.json; a failed collective in the step after the last
            _run.record.fail(error, ("training", _run.step_no + 1))
        _previous_hook(kind, error, tb)

    sys.excepthook = record_failure
    return ddp


def step(loss, tokens: int = 0, lr: float | None = None, step: int | None = None) -> dict | None:
    """Call once per optimizer step, after optimizer.step() (and before zero_grad): records the
    step (`tokens`: this rank's tokens in it) and runs a periodic method's sync when one is due.
    Returns the step's record; None outside a fatpipe run.

    `step`: this step's number (from 1), the same on every rank, for a script that resumed from
    its own checkpoint; later calls without it count on from there. Without it, the count goes on
    from the last step the run folder recorded, also after a restart. A step at or below one
    already recorded rewinds the record: the earlier lines stay in metrics.jsonl, and the run's
    steps are the ones written last (`trainer.metrics`)."""
    global _steps_outside
    if step is not None:
        step = _step_number(step)
    if _run is None and not _wrapped and run_config() is not None:
        raise RuntimeError("fatpipe.step() records the model fatpipe.wrap() returned: "
                           "call fatpipe.wrap(model) before the first step")
    if _run is None:  # outside a run nothing is recorded; steps_done() still counts
        _steps_outside = step if step is not None else _steps_outside + 1
        return None
    return _run.step(loss, tokens, lr, step)


def optimizer(opt: torch.optim.Optimizer, *stateful) -> RunOptimizer:
    """`opt` stepped through the run, before or after wrap(): its step() says whether it stepped
    (under live only when the quorum commits; in every other mode always). `opt` and `stateful`
    (a scheduler: anything with state_dict and load_state_dict) are what a returning node is
    sent under live."""
    _stateful[:] = [opt, *stateful]
    if _run is not None and _run.live is not None:
        _run.live.stateful[:] = _stateful
    return RunOptimizer(opt, lambda: _run.live if _run is not None else None)


def steps_done() -> int:
    """The optimizer steps the run has taken: under live the quorum's committed steps (a node
    that rejoined is at the others' count), else this process's recorded steps."""
    if _run is None:
        return _steps_outside  # the calls to step() (plain torchrun: a loop on it still ends)
    return _run.live.steps_done() if _run.live else _run.step_no


def data_shard() -> tuple[int, int]:
    """(this rank's shard, the number of shards) for the script's sampler: its rank among every
    rank the cluster declares, before or after wrap(). Under live each node's group numbers its
    ranks from 0, so this, not dist.get_rank(), keeps nodes from reading the same data."""
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:  # before the script's init_process_group: what torchrun told this process
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cfg = _run.cfg if _run is not None else run_config()
    if cfg is not None and cfg.fault_tolerance == "live":
        settings = settings_from_env()
        return settings.node_rank * world + rank, settings.nodes * world
    return rank, world


def _step_number(step) -> int:
    try:
        number = operator.index(step)  # an int, numpy's, a 0-d integer tensor; not a float
    except TypeError:
        number = None
    if number is None or isinstance(step, bool) or number < 1:
        raise ValueError(f"fatpipe.step(step=...) takes the step's number, an integer from 1: "
                         f"got {step!r}")
    return number


def finish() -> None:
    """Write the run's summary.json (rank 0). Runs by itself when the script exits."""
    global _run
    if _run is not None:
        run, _run = _run, None
        run.finish()


def run_dir() -> Path | None:
    """The run folder this process records into (a place for the script's own files too)."""
    return _run.cfg.out_dir if _run is not None else None
