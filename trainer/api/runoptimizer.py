"""The script's optimizer as `fatpipe.optimizer()` returns it: one object in every mode and order.

Under `fault_tolerance = "live"` its step() steps only when the quorum commits; elsewhere
(restart, plain torchrun, one process) it steps every time. Either way step() says whether it
stepped, so the documented loop `if optimizer.step(): scheduler.step()` is right in every mode.
The run is looked up at each step, not when the optimizer is wrapped, so `fatpipe.optimizer()`
may come before or after `fatpipe.wrap()`.

It is an `Optimizer` (as torchft's OptimizerWrapper is) so that a scheduler built on it accepts
it; its parameter groups and state are the wrapped optimizer's own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .livescript import LiveScript


class RunOptimizer(torch.optim.Optimizer):
    """`optimizer` stepped through the run: `live_of()` is the run's live side, or None."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 live_of: Callable[[], LiveScript | None]):
        # Optimizer.__init__ is not called: the groups and state stay the wrapped optimizer's.
        self._optimizer, self._live_of = optimizer, live_of

    def step(self, closure=None) -> bool:
        live = self._live_of()
        if live is None:
            self._optimizer.step(closure)
            return True
        return live.commit(self._optimizer, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        self._optimizer.add_param_group(param_group)

    def state_dict(self) -> dict:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._optimizer.load_state_dict(state_dict)

    @property
    def param_groups(self) -> list[dict]:
        return self._optimizer.param_groups

    @property
    def state(self):
        return self._optimizer.state

    @property
    def defaults(self) -> dict:
        return self._optimizer.defaults

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_optimizer", "_live_of"):
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"fatpipe.optimizer({self._optimizer!r})"
