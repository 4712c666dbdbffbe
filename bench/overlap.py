"""Exposed communication of DDP: step time with gradient sync over the same step under no_sync().

Two local processes train the same GPT (gloo on CPU, NCCL when there are two GPUs). For each
comm hook, blocks of steps with DDP's all-reduce alternate with blocks under `no_sync()`
(identical compute, no communication), so drift hits both alike. The ratio DDP / no_sync is
1.00 when communication hides entirely behind backward; the difference is the exposed
communication per step, printed beside the `exposed_comm_s` the trainer's hook wrapper measures
in-process, as a cross-check of that metric.

    .venv/bin/python bench/overlap.py [--preset small] [--comm none bf16 powersgd] [--out bench/out]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NPROC = 2
JOIN_TIMEOUT_S = 1800


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(args, rank: int, comm: str):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fatpipe.trainer.comm.hooks import TimedCommHook, make_powersgd_state
    from fatpipe.trainer.model import GPT, preset_config

    cuda = torch.cuda.device_count() >= NPROC
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = GPT(preset_config(args.preset, args.seq_len)).to(device)
    cap = args.bucket_cap_mb
    if comm == "powersgd" and not cuda:
        cap = model.num_params() * 4 / 2**20 + 1  # the trainer's gloo guard: one bucket
    ddp = DDP(model, device_ids=[rank] if cuda else None, bucket_cap_mb=cap,
              gradient_as_bucket_view=True)
    meter = TimedCommHook(device)
    ddp.register_comm_hook(None, meter.hook)
    # start_iter 2: compress from the third step, so warmup steps cover the switch.
    meter.use(comm, make_powersgd_state(4, 2, 0) if comm == "powersgd" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return device, model, ddp, meter, opt


def timed_step(ddp, opt, meter, x, device, sync: bool) -> tuple[float, float]:
    """One training step, with gradient sync or under no_sync(); (seconds, hook's exposed_s)."""
    meter.begin_step()
    start = time.perf_counter()
    with contextlib.nullcontext() if sync else ddp.no_sync():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            _, loss = ddp(x, x)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, meter.end_step().exposed_s


def worker(rank: int, args, port: int, result_path: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or NPROC) // NPROC))  # no oversubscription
    backend = "nccl" if torch.cuda.device_count() >= NPROC else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=NPROC, timeout=datetime.timedelta(seconds=600))
    results = {}
    try:
        for comm in args.comm:
            device, model, ddp, meter, opt = build(args, rank, comm)
            x = torch.randint(0, model.cfg.vocab_size, (args.batch_size, args.seq_len),
                              device=device)
            for i in range(args.warmup):
                timed_step(ddp, opt, meter, x, device, sync=i % 2 == 0)
            times = {"ddp": [], "no_sync": [], "hook_exposed": []}
            for block in range(args.blocks):
                for sync in (block % 2 == 0, block % 2 == 1):  # alternate which goes first
                    for _ in range(args.steps):
                        t, exposed = timed_step(ddp, opt, meter, x, device, sync)
                        times["ddp" if sync else "no_sync"].append(t)
                        if sync:
                            times["hook_exposed"].append(exposed)
            # The slowest rank sets the pace: keep, per step, the larger of the two ranks.
            gathered = [None] * NPROC
            dist.all_gather_object(gathered, times)
            results[comm] = {k: [max(v) for v in zip(*(g[k] for g in gathered), strict=True)]
                             for k in times}
            if rank == 0:
                report_line(comm, results[comm])
            del ddp, model, opt
        if rank == 0:
            Path(result_path).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def summarize(times: dict) -> dict:
    ddp, nosync = statistics.median(times["ddp"]), statistics.median(times["no_sync"])
    return {"ddp_step_s": ddp, "no_sync_step_s": nosync, "ratio": ddp / nosync,
            "exposed_s": max(0.0, ddp - nosync),
            "hook_exposed_s": statistics.median(times["hook_exposed"])}


def report_line(comm: str, times: dict) -> None:
    s = summarize(times)
    print(f"{comm:<9} {s['ddp_step_s'] * 1e3:>9.1f} {s['no_sync_step_s'] * 1e3:>12.1f} "
          f"{s['ratio']:>7.2f} {s['exposed_s'] * 1e3:>11.1f} {s['hook_exposed_s'] * 1e3:>12.1f}",
          flush=True)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["hooks"])
    ddp = [result["hooks"][n]["ddp_step_s"] * 1e3 for n in names]
    nosync = [result["hooks"][n]["no_sync_step_s"] * 1e3 for n in names]
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.bar([x - 0.2 for x in xs], nosync, 0.4, label="no_sync() (compute only)", color="grey")
    ax.bar([x + 0.2 for x in xs], ddp, 0.4, label="DDP (with gradient sync)", color="tab:blue")
    for x, n in zip(xs, names, strict=True):
        ax.text(x + 0.2, ddp[x], f"{result['hooks'][n]['ratio']:.2f}x", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"DDP exposed communication, {result['preset']}, {NPROC} processes, "
                 f"{result['backend']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    cuda = torch.cuda.device_count() >= NPROC
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=("tiny", "small", "124m"))
    parser.add_argument("--comm", nargs="+", default=["none", "bf16", "powersgd"],
                        choices=("none", "bf16", "fp16", "powersgd"))
    parser.add_argument("--batch-size", type=int, default=8 if cuda else 1)
    parser.add_argument("--seq-len", type=int, default=256 if cuda else 128)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=2, help="alternating DDP/no_sync blocks")
    parser.add_argument("--steps", type=int, default=4, help="steps per block")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()

    backend = "nccl" if cuda else "gloo"
    print(f"{NPROC} processes, {backend}, preset {args.preset}, batch {args.batch_size} x "
          f"{args.seq_len}, bucket {args.bucket_cap_mb} MB", flush=True)
    print(f"{'comm':<9} {'ddp ms':>9} {'no_sync ms':>12} {'ratio':>7} {'exposed ms':>11} "
          f"{'hook exp ms':>12}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fatpipe-overlap-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        ctx = mp.start_processes(worker, args=(args, free_port(), result_path), nprocs=NPROC,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                print("overlap bench: workers did not finish in time", file=sys.stderr)
                return 1
        raw = json.loads(Path(result_path).read_text())
    result = {
        "bench": "overlap", "date": time.strftime("%Y-%m-%d"), "preset": args.preset,
        "backend": backend, "nproc": NPROC, "batch_size": args.batch_size,
        "seq_len": args.seq_len, "bucket_cap_mb": args.bucket_cap_mb,
        "torch": torch.__version__, "python": platform.python_version(),
        "cpus": os.cpu_count(), "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "hooks": {comm: summarize(times) for comm, times in raw.items()}, "raw_s": raw,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overlap.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "overlap.png")
    print(f"wrote {args.out / 'overlap.json'} and overlap.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
