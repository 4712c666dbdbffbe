"""The console's step line: a user script's step() that gives no learning rate shows none."""

from __future__ import annotations

import pytest

from fatpipe.trainer.metrics import format_record

pytestmark = pytest.mark.timeout(30)

REC = {"step": 3, "loss": 4.25, "lr": 3e-4, "step_s": 0.1, "sync_s": 0.02, "exposed_comm_s": 0.01,
       "tokens_per_s": 1000.0, "wire_bytes": 4e5, "grad_bytes": 4e5, "busbw_gbps": 0.5,
       "nic_tx_gbps": 0.1, "comm": "none"}


def test_the_learning_rate_shows_when_known():
    assert format_record(REC, 10).startswith("step 3/10 loss 4.2500 lr 3.00e-04 step 100 ms")


def test_a_script_that_gives_no_learning_rate_shows_none():
    line = format_record({**REC, "lr": None}, 10)
    assert line.startswith("step 3/10 loss 4.2500 step 100 ms") and "lr" not in line


def test_a_script_that_did_not_say_its_step_count_gets_no_made_up_total():
    # wrap() without steps=: the [train] default (200) is no total of the script's loop.
    assert format_record(REC, None).startswith("step 3 loss 4.2500 lr")


def test_a_scripts_console_total_is_its_own(tmp_path, capsys):
    from fatpipe.trainer.metrics import MetricsLog

    for total, first, printed in ((None, "step 1 loss", 2), (400, "step 1/400 loss", 2), (30, "step 1/30 loss", 11)):
        log = MetricsLog(tmp_path, total)
        for step in range(1, 12):
            log.log({**REC, "step": step})
        log.close()
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith(first) and len(lines) == printed, lines  # unknown: steps 1 and 10
