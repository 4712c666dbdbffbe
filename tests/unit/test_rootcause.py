"""The first error of a failed run, from torchrun's per-rank error files and its report in the
node logs, without processes; and a detached run's progress as node 0 reports it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fatpipe.ops.rdzv.noderun import LaunchResult
from fatpipe.ops.run.failure import describe_failure
from fatpipe.ops.run.progress import _SEP, parse_progress
from fatpipe.ops.run.rootcause import first_cause, worker_errors

pytestmark = pytest.mark.timeout(60)

CHILD_FAILED = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
job.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_19:00:01
  host      : n-1
  rank      : 1 (local_rank: 0)
  exitcode  : 3 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def error_file(run_dir: Path, node: int, attempt: int, rank: int, kind: str, text: str, when: float,
               **extra) -> None:
    folder = run_dir / "torchrun" / f"node-{node}" / "r_x1" / f"attempt_{attempt}" / "0"
    folder.mkdir(parents=True)
    record = {"rank": rank, "node": f"n-{node}", "time": when, "type": kind, "text": text, **extra}
    (folder / "error.json").write_text(json.dumps({"message": {
        "message": f"{kind}: {text}", "extraInfo": {"timestamp": str(int(when)), "fatpipe": record}}}))


def rendezvous(transport: str = "netns") -> SimpleNamespace:
    nodes = [SimpleNamespace(name=f"n-{r}", transport=transport, workdir=f"w/n-{r}") for r in range(2)]
    return SimpleNamespace(max_restarts=0, join_timeout_s=180, nodes=nodes)


def failed(run_dir: Path) -> LaunchResult:
    return LaunchResult("r", run_dir, exit_codes={"n-0": 1, "n-1": 1})


def test_the_raising_rank_is_named_not_the_connection_error_before_it(tmp_path):
    # Rank 0's connection error has the earlier time (clocks, or the order files were written):
    # it is a consequence, so rank 1's own error is the cause.
    error_file(tmp_path, 0, 0, 0, "RuntimeError", "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer", 9.0)
    error_file(tmp_path, 1, 0, 1, "OldError", "from an attempt before the last", 1.0)
    error_file(tmp_path, 1, 1, 1, "ValueError", "device_ids must be None", 10.0)
    error_file(tmp_path, 0, 1, 0, "DistNetworkError", "Connection reset by peer", 10.5)
    assert describe_failure(failed(tmp_path), rendezvous(), 0) == (
        "rank 1 on n-1 failed first: ValueError: device_ids must be None; the connection errors on "
        "n-0 followed from it")


def test_the_earliest_of_several_real_errors_is_named(tmp_path):
    error_file(tmp_path, 0, 0, 0, "ValueError", "bad setting on rank 0", 10.2)
    error_file(tmp_path, 1, 0, 1, "ValueError", "bad setting on rank 1", 10.1)
    assert describe_failure(failed(tmp_path), rendezvous(), 0) == (
        "rank 1 on n-1 failed first: ValueError: bad setting on rank 1; 1 other rank(s) failed too (n-0)")


def test_an_exit_without_an_exception_comes_from_torchruns_report(tmp_path):
    error_file(tmp_path, 0, 0, 0, "RuntimeError", "Gloo connectFullMesh failed with Connection refused", 9.0)
    (tmp_path / "node-1.log").write_text("something printed\n" + CHILD_FAILED)
    (cause,) = [e for e in worker_errors(tmp_path, ["n-0", "n-1"]) if not e.type]
    assert (cause.rank, cause.node, cause.exitcode) == (1, "n-1", 3)
    assert describe_failure(failed(tmp_path), rendezvous(), 0) == (
        "rank 1 on n-1 failed first: exit status 3, without a Python exception; the connection "
        "errors on n-0 followed from it")


def test_only_consequences_name_no_cause(tmp_path):
    error_file(tmp_path, 0, 0, 0, "RuntimeError", "Timed out waiting 8000ms for recv operation to complete", 9.0)
    assert first_cause(worker_errors(tmp_path, ["n-0", "n-1"])) is None
    # ops.run.failure then goes on as before: the trainer's faults.json, the logs, the exit codes.
    assert describe_failure(failed(tmp_path), rendezvous(), 0) == "n-0 failed first: exit status 1"


def test_a_missing_file_on_a_shared_filesystem_gets_no_hint(tmp_path):
    (tmp_path / "data.bin").write_text("here")
    error_file(tmp_path, 0, 0, 0, "FileNotFoundError", "[Errno 2] No such file or directory: 'data.bin'", 9.0,
               filename="data.bin", errno=2)
    assert describe_failure(failed(tmp_path), rendezvous("netns"), 0, tmp_path) == (
        "rank 0 on n-0 failed first: FileNotFoundError: [Errno 2] No such file or directory: 'data.bin'")


def test_the_leaders_progress_is_read_back():
    metrics = "\n".join(json.dumps({"step": s, "loss": 5.0 - s / 10}) for s in range(1, 8)) + '\n{"step": 8, "lo'
    out = f"{len(metrics)}\n{metrics}{_SEP}{_SEP}running\n{_SEP}0\n"
    assert parse_progress(out) == {"last_step": 7, "final_loss": 4.3, "summary": None, "state": "running",
                                   "group_rank": 0}
    done = f"0\n{_SEP}{json.dumps({'steps': 9, 'final_loss': 4.1})}{_SEP}0\n{_SEP}"  # no record (yet)
    assert parse_progress(done) == {"last_step": 9, "final_loss": 4.1, "summary": {"steps": 9, "final_loss": 4.1},
                                    "state": "0", "group_rank": None}
    assert parse_progress("ssh: connect to host refused") is None


def test_a_script_error_hidden_by_the_restarts_after_it_is_still_named(tmp_path):
    # Attempt 0: rank 0 raised its own error; attempts 1 and 2 (restarts) only met connection
    # errors, and torchrun's last word was the rendezvous closing: the line names attempt 0's.
    error_file(tmp_path, 0, 0, 0, "ValueError", "DistributedDataParallel device_ids ...", 5.0)
    error_file(tmp_path, 1, 0, 1, "RuntimeError", "Gloo connectFullMesh failed ... Connection refused", 4.0)
    for attempt in (1, 2):
        for node in (0, 1):
            error_file(tmp_path, node, attempt, node, "RuntimeError",
                       "Gloo connectFullMesh failed ... Connection closed by peer", 10.0 + attempt)
    (tmp_path / "node-0.log").write_text("torch.distributed.elastic.rendezvous.api.RendezvousClosedError\n")
    assert first_cause(worker_errors(tmp_path, ["n-0", "n-1"])) is None
    rdzv = rendezvous()
    rdzv.max_restarts = 2
    assert describe_failure(failed(tmp_path), rdzv, 0) == (
        "rank 0 on n-0 failed first (attempt 1 of 3; the restarts after it ended in connection "
        "errors only): ValueError: DistributedDataParallel device_ids ...; the connection errors on "
        "n-1 followed from it")


def env_file(run_dir: Path, cuda: str | None) -> None:
    node = {"python": "3.11.7", "torch": "2.13.0+cpu" if cuda is None else "2.13.0+cu128", "cuda": cuda}
    (run_dir / "env.json").write_text(json.dumps({"nodes": {"n-0": node, "n-1": node}, "same": True}))


def test_a_script_asking_for_cuda_on_cpu_nodes_is_told_so(tmp_path):
    # nanoGPT's DDP branch calls torch.cuda.set_device whatever --device says.
    error_file(tmp_path, 0, 0, 0, "AttributeError", "module 'torch._C' has no attribute '_cuda_setDevice'", 5.0)
    env_file(tmp_path, None)
    assert describe_failure(failed(tmp_path), rendezvous(), 0) == (
        "rank 0 on n-0 failed first: AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'; "
        'n-0 has no CUDA (torch 2.13.0+cpu): run the script on CPU (its device "cpu", the gloo backend, '
        "DDP without device_ids)")
    env_file(tmp_path, "12.8")  # nodes with CUDA: the error is something else, no hint
    assert describe_failure(failed(tmp_path), rendezvous(), 0).endswith("'_cuda_setDevice'")
