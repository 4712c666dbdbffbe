"""What `up` says instead of a summary table of dashes when a run recorded no steps."""

from __future__ import annotations

import pytest

from fatpipe.ops.run.summary import no_steps_hint

pytestmark = pytest.mark.timeout(30)


def test_a_run_that_failed_before_its_first_step_gets_one_line():
    assert no_steps_hint(["train.py"], False, {}) == (
        "no steps recorded before the run failed (the launch line says why)")
    assert no_steps_hint([], False, {"steps": None}) is not None  # the built-in trainer too


def test_a_script_without_the_api_is_pointed_at_it():
    assert no_steps_hint(["train.py"], True, {}).startswith("train.py recorded no steps for fatpipe")
    assert no_steps_hint([], True, {}) is None  # the built-in trainer always records


def test_a_run_with_steps_gets_its_table():
    assert no_steps_hint(["train.py"], False, {"steps": 3}) is None
    assert no_steps_hint(["train.py"], True, {"steps": 3}) is None
