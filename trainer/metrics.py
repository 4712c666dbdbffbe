"""Rank 0's metrics: one JSON line per step, TensorBoard, a console line, and summary.json.

metrics.jsonl only grows: nothing a run recorded is cut, whoever trained (the built-in trainer
or a user's script, through `api.record`). A run that started again continues its record: a
script's step count goes on from the last recorded step (`api.scriptrun`), the built-in trainer
goes on from its checkpoint. A run that goes back (the trainer resuming at a checkpoint older
than its last line, a script passing `step=N` at or below a step recorded) writes those steps
again after the old lines, and its first line back carries `rewound_from`: the last step
recorded before it. So the file holds every attempt, and the run's steps are what its lines say
last (`read_metrics`, `latest_steps`): a line for step N replaces the line for N and every step
after it that came before. TensorBoard hides those steps' earlier events the same way
(`purge_step`, which deletes nothing either).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from .lazy import load

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TAIL_BYTES = 64 * 1024  # enough of the file's end for its last record


def parse_lines(text: str) -> list[dict]:
    """The step records among `text`'s lines; a line torn by a kill, or not a record, is skipped."""
    records = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            records.append(rec)
    return records


def latest_steps(records: Iterable[dict]) -> list[dict]:
    """The run's steps from its records in the order written: a record for step N replaces the
    earlier records of N and of every step after N (a resume or a rewind wrote them again)."""
    steps: list[dict] = []
    for rec in records:
        while steps and steps[-1]["step"] >= rec["step"]:
            steps.pop()
        steps.append(rec)
    return steps


def read_metrics(path: Path) -> list[dict]:
    """The run's steps in metrics.jsonl, each once, as its lines say last (nothing if absent)."""
    path = Path(path)
    return latest_steps(parse_lines(path.read_text())) if path.exists() else []


def last_step(path: Path) -> int:
    """The step of the last record in metrics.jsonl (read from its end); 0 when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            records = parse_lines(f.read().decode(errors="replace"))
    except OSError:
        return 0
    return records[-1]["step"] if records else 0


class MetricsLog:
    """Appends each step's record to metrics.jsonl (and the `mirror` folder's), TensorBoard and
    the console."""

    def __init__(self, run_dir: Path, total_steps: int | None, mirror: Path | None = None):
        self.path, self.tb_dir = run_dir / METRICS_FILE, run_dir / "tb"
        self.last_step = last_step(self.path)  # what the record holds: a restart goes on from it
        self._files = [_appender(self.path)]
        if mirror is not None:
            mirror.mkdir(parents=True, exist_ok=True)
            self._files.append(_appender(mirror / METRICS_FILE))
        self._tb = _tensorboard(self.tb_dir, purge_step=None)
        self._console = _console(total_steps, self.last_step)

    def log(self, rec: dict) -> None:
        step = rec["step"]
        if step <= self.last_step:
            self._rewind(rec)
        self.last_step = step
        for file in self._files:
            file.write(json.dumps(rec) + "\n")
        if self._tb is not None:
            self._tb_scalars(rec)
        self._console.update(rec)

    def _rewind(self, rec: dict) -> None:
        """The run went back to `rec`'s step: say so in the record and the log; TensorBoard
        hides its own later events from here (a new writer with purge_step)."""
        rec["rewound_from"] = self.last_step
        log.warning("metrics: step %d after step %d: steps %d-%d recorded before stay in %s, "
                    "replaced by the ones written from here", rec["step"], self.last_step,
                    rec["step"], self.last_step, self.path.name)
        if self._tb is not None:
            self._tb.close()
            self._tb = _tensorboard(self.tb_dir, purge_step=rec["step"])

    def _tb_scalars(self, rec: dict) -> None:
        """The record's numbers as one TensorBoard event: an event per number (add_scalar) costs
        a queue hand-off to the writer thread each, a few milliseconds a step on a busy machine."""
        summary = load("tensorboard.compat.proto.summary_pb2").Summary
        values = [summary.Value(tag=f"train/{key}", simple_value=float(value))
                  for key, value in rec.items()
                  if key not in ("step", "rewound_from") and isinstance(value, (int, float))]
        self._tb.file_writer.add_summary(summary(value=values), rec["step"])

    def close(self) -> None:
        self._console.close()
        for file in self._files:
            file.close()
        if self._tb is not None:
            self._tb.close()


def _appender(path: Path):
    """`path` opened to append lines, line-buffered (a kill loses one line); a line a kill cut
    short stays, on a line of its own (readers skip it)."""
    torn = _torn(path)
    file = open(path, "a", buffering=1)
    if torn:
        file.write("\n")
    return file


def _torn(path: Path) -> bool:
    """Whether the file's last line has no end."""
    try:
        with open(path, "rb") as f:
            if not f.seek(0, os.SEEK_END):
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


def _tensorboard(folder: Path, purge_step: int | None):
    try:
        summary_writer = load("torch.utils.tensorboard").SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    # purge_step: TensorBoard hides the events this folder already has from that step on.
    return summary_writer(str(folder), purge_step=purge_step)


def _console(total: int | None, start: int):
    if sys.stdout.isatty():
        try:
            return _RichLine(total, start)
        except ImportError:  # rich is optional on the nodes
            pass
    return _PlainLines(total, start)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def format_record(rec: dict, total: int | None) -> str:
    """One step's line; `total` None: a script that did not say how many steps it runs."""
    lr = "" if rec.get("lr") is None else f"lr {rec['lr']:.2e} "  # a script's step() may not say
    of = "" if total is None else f"/{total}"
    return (f"step {rec['step']}{of} loss {rec['loss']:.4f} {lr}"
            f"step {rec['step_s'] * 1e3:.0f} ms sync {rec['sync_s'] * 1e3:.0f} ms "
            f"exposed {rec['exposed_comm_s'] * 1e3:.0f} ms {rec['tokens_per_s']:,.0f} tok/s "
            f"wire {rec['wire_bytes'] / 1e6:.2f}/{rec['grad_bytes'] / 1e6:.2f} MB "
            f"busbw {rec['busbw_gbps']:.2f} tx {rec['nic_tx_gbps']:.2f} Gbit/s "
            f"comm {rec['comm']}")


class _PlainLines:
    """Plain lines for logs and pipes: the first step, every tenth, and the last."""

    def __init__(self, total: int | None, start: int):
        self.total = total
        self.every = 10 if total is None else max(1, min(10, total // 20))

    def update(self, rec: dict) -> None:
        s = rec["step"]
        if s == 1 or s % self.every == 0 or s == self.total:
            print(format_record(rec, self.total), flush=True)

    def close(self) -> None:
        pass


class _RichLine:
    """A live progress bar with the latest step's numbers, for terminals."""

    def __init__(self, total: int | None, start: int):  # None: rich shows no bar end
        bar = load("rich.progress")  # rich is optional on the nodes
        self.total = total
        self._progress = bar.Progress(bar.TextColumn("train"), bar.BarColumn(), bar.MofNCompleteColumn(),
                                      bar.TimeRemainingColumn(), bar.TextColumn("{task.fields[info]}"))
        self._task = self._progress.add_task("train", total=total, completed=start, info="")
        self._progress.start()

    def update(self, rec: dict) -> None:
        info = (f"loss {rec['loss']:.3f}  {rec['tokens_per_s']:,.0f} tok/s  "
                f"sync {rec['sync_s'] * 1e3:.0f} ms  exposed {rec['exposed_comm_s'] * 1e3:.0f} ms"
                f"  tx {rec['nic_tx_gbps']:.2f} Gbit/s  {rec['comm']}")
        self._progress.update(self._task, completed=rec["step"], info=info)

    def close(self) -> None:
        self._progress.stop()


def summarize(records: list[dict], tokens_per_step: int, **extra) -> dict:
    """summary.json: percentiles and totals over every step of the run (all attempts).

    Sync figures are over the steps that synchronised: under a periodic method (local SGD,
    DiLoCo) most steps send nothing, and a median over them would say syncs take no time.
    """
    synced = [r for r in records if r["wire_bytes"] > 0] or records

    def pct(key: str, q: float, rows: list[dict] = records) -> float:
        return percentile([r[key] for r in rows], q)

    last = records[-1] if records else {}
    step_p50 = pct("step_s", 50)
    # Throughput at the median step: robust to the compile / first-step outliers. A periodic
    # method's median step sends nothing, so there the mean over the run counts its syncs.
    periodic = len(synced) < len(records)
    total_s = sum(r["step_s"] for r in records)
    per_step_s = total_s / len(records) if periodic else step_p50
    return {
        "steps": len(records),
        "final_loss": last.get("loss"),
        "tokens_per_s": tokens_per_step / per_step_s if per_step_s else 0.0,
        "step_s_p50": step_p50,
        "step_s_p95": pct("step_s", 95),
        "sync_s_p50": pct("sync_s", 50, synced),
        "sync_s_p95": pct("sync_s", 95, synced),
        "syncs": sum(1 for r in records if r["wire_bytes"] > 0),
        "exposed_comm_s_p50": pct("exposed_comm_s", 50),
        "busbw_gbps": pct("busbw_gbps", 50, synced),
        "nic_tx_gbps": pct("nic_tx_gbps", 50),
        "grad_bytes_total": sum(r["grad_bytes"] for r in records),
        "wire_bytes_total": sum(r["wire_bytes"] for r in records),
        **extra,
    }
