"""metrics.jsonl only grows: a run started again continues its record, a rewind is written after
the old lines and marked, and readers take each step as recorded last (trainer.metrics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fatpipe.ops.plan.report import read_metrics as report_steps
from fatpipe.trainer import api
from fatpipe.trainer.metrics import MetricsLog, last_step, latest_steps, read_metrics


def rec(step: int, loss: float = 1.0) -> dict:
    return {"step": step, "loss": loss, "lr": None, "step_s": 0.1, "tokens_per_s": 10.0,
            "sync_s": 0.01, "exposed_comm_s": 0.0, "grad_bytes": 8, "wire_bytes": 8,
            "busbw_gbps": 1.0, "nic_tx_gbps": 0.0, "nic_rx_gbps": 0.0, "comm": "none"}


def write(folder, steps, loss: float = 1.0) -> list[dict]:
    """One attempt: a MetricsLog opened on `folder`, `steps` logged, closed; the records."""
    metrics = MetricsLog(folder, None)
    records = [rec(s, loss) for s in steps]
    for r in records:
        metrics.log(r)
    metrics.close()
    return records


def lines(folder) -> list:
    return [json.loads(line) if line.startswith("{\"step\": ") and line.endswith("}") else line
            for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_run_started_again_keeps_its_record_and_continues_it(tmp_path):
    first = write(tmp_path, [1, 2, 3])
    assert MetricsLog(tmp_path, None).last_step == 3
    second = write(tmp_path, [4, 5], loss=2.0)
    assert lines(tmp_path) == first + second
    assert read_metrics(tmp_path / "metrics.jsonl") == first + second
    assert "rewound_from" not in json.dumps(lines(tmp_path))


@pytest.mark.parametrize("back_to", [1, 3, 5])
def test_a_rewind_keeps_the_old_lines_marks_itself_and_readers_take_the_latest(tmp_path, back_to):
    old = write(tmp_path, range(1, 6))
    new = write(tmp_path, range(back_to, back_to + 2), loss=2.0)
    assert new[0]["rewound_from"] == 5 and "rewound_from" not in new[1]
    assert lines(tmp_path) == old + new  # nothing erased
    steps = read_metrics(tmp_path / "metrics.jsonl")
    assert steps == old[:back_to - 1] + new and [r["step"] for r in steps] == list(range(1, back_to + 2))
    assert report_steps(tmp_path) == steps  # fatpipe report reads the same
    assert last_step(tmp_path / "metrics.jsonl") == back_to + 1


def test_latest_steps_over_several_attempts_and_a_gap():
    written = [1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8, 2, 3, 10]  # attempts resumed at 4, then at 1; a gap
    records = [{"step": s, "n": i} for i, s in enumerate(written)]
    assert [(r["step"], r["n"]) for r in latest_steps(records)] == [(1, 0), (2, 11), (3, 12), (10, 13)]


def test_a_line_torn_by_a_kill_stays_and_is_skipped(tmp_path):
    write(tmp_path, [1, 2])
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 3, "lo')  # killed mid-line
    assert last_step(path) == 2
    write(tmp_path, [3], loss=2.0)
    text = path.read_text()
    assert '{"step": 3, "lo\n' in text  # kept, on a line of its own
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 1.0), (2, 1.0), (3, 2.0)]


def test_tensorboard_hides_the_rewound_steps_and_keeps_the_rest(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write(tmp_path, range(1, 6))
    write(tmp_path, [6])  # a continuation purges nothing
    write(tmp_path, [3, 4], loss=2.0)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0)]
    assert "train/rewound_from" not in events.Tags()["scalars"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", torch.tensor(2.0)])
def test_a_step_number_is_an_integer_from_one(bad):
    with pytest.raises(ValueError, match=r"fatpipe.step\(step=...\) takes the step's number"):
        api.step(torch.tensor(1.0), step=bad)


# One process (gloo, world 1) records into the run folder; each call is one start of the script.
SCRIPT = """
import json, os, sys, numpy, torch, torch.distributed as dist
import fatpipe.trainer.api as fatpipe
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = fatpipe.wrap(torch.nn.Linear(4, 4), comm=sys.argv[2], run_dir=sys.argv[1],
                     allow_periodic=True)
given = json.loads(sys.argv[3])  # each step's step=, or null
for number in given:
    loss = model(torch.randn(2, 4)).square().mean()
    loss.backward()
    fatpipe.step(loss, tokens=2, step=None if number is None else numpy.int64(number))
sys.stdout.flush()
fatpipe.finish()
os._exit(0)
"""


def start_script(folder, given: list, comm: str = "none") -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), comm, json.dumps(given)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_script_started_again_continues_and_a_script_that_passes_its_step_is_followed(tmp_path):
    start_script(tmp_path, [None] * 3)
    start_script(tmp_path, [None, None])  # started again: it counts on from the record
    assert [r["step"] for r in lines(tmp_path)] == [1, 2, 3, 4, 5]
    # Resumed from its own checkpoint of step 1: the record follows it back, keeping the lines.
    start_script(tmp_path, [2, None, None], comm="localsgd")
    written = lines(tmp_path)
    assert [r["step"] for r in written] == [1, 2, 3, 4, 5, 2, 3, 4]
    assert written[5]["rewound_from"] == 5
    steps = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and steps[1:] == written[5:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["final_loss"] == written[-1]["loss"]
    # Forward past a gap: the script's own number.
    start_script(tmp_path, [10, None])
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 10, 11]
