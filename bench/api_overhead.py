"""The API's overhead on a user script: step time with and without fatpipe's per-step call.

Two local processes (gloo on CPU, NCCL when there are two GPUs) each hold two copies of
examples/ddp_script.py's model: one in plain DDP, one through `fatpipe.wrap` (its timed comm
hook, comm none) with `fatpipe.step` after every optimizer step, recording into a scratch run
folder as under `fatpipe up` (metrics.jsonl, node metrics, fault counts). Blocks of steps of
the two alternate in one run, so drift hits both alike; the ratio of their median step times
is the overhead (goal: under 2%).

    .venv/bin/python bench/api_overhead.py [--steps 200] [--block 10] [--out bench/out]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
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
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp_script.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def example():
    spec = importlib.util.spec_from_file_location("ddp_script", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(rank: int, args, port: int, run_dir: str, result: str) -> None:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fatpipe.trainer.api as fatpipe

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.device_count() >= NPROC
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=NPROC)
    ex = example()
    torch.manual_seed(0)
    kw = {"device_ids": [rank]} if cuda else {}
    plain = DDP(ex.TinyLM(args.seq_len).to(device), gradient_as_bucket_view=True, **kw)
    torch.manual_seed(0)
    wrapped = fatpipe.wrap(ex.TinyLM(args.seq_len).to(device), comm="none", steps=args.steps,
                           run_dir=run_dir)
    opts = {id(m): torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (plain, wrapped)}
    data = ex.corpus(1 << 20)
    gen = torch.Generator().manual_seed(rank)
    times: dict[str, list[float]] = {"plain": [], "api": [], "in_step": []}

    def one_step(model, with_api: bool) -> float:
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=gen)
        window = torch.stack([data[s: s + args.seq_len + 1] for s in starts.tolist()]).to(device)
        x, y = window[:, :-1], window[:, 1:]
        begin = time.perf_counter()
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opts[id(model)].step()
        if with_api:
            called = time.perf_counter()
            fatpipe.step(loss, tokens=x.numel())
            times["in_step"].append(time.perf_counter() - called)
        else:
            loss.item()  # the API reads the loss too: the same device sync on both sides
        opts[id(model)].zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - begin

    for block in range(args.steps // args.block):
        for name, model in (("plain", plain), ("api", wrapped)):
            for _ in range(args.block):
                took = one_step(model, name == "api")
                if block > 0:  # the first block of each allocates and warms up
                    times[name].append(took)
    fatpipe.finish()
    if rank == 0:
        Path(result).write_text(json.dumps(times))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="steps of each kind")
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("bench/out"))
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "times.json"
        mp.spawn(worker, args=(args, free_port(), str(Path(tmp) / "run"), str(result)),
                 nprocs=NPROC)
        times = json.loads(result.read_text())
    plain, api = statistics.median(times["plain"]), statistics.median(times["api"])
    in_step = statistics.median(times["in_step"])
    doc = {"steps_each": len(times["plain"]), "plain_step_s_p50": plain, "api_step_s_p50": api,
           "ratio": api / plain, "in_step_call_s_p50": in_step, "torch": torch.__version__,
           "python": sys.version.split()[0]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "api_overhead.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"step p50: plain DDP {plain * 1e3:.2f} ms, with fatpipe.wrap + step {api * 1e3:.2f} ms, "
          f"ratio {api / plain:.3f} ({(api / plain - 1) * 100:+.1f}%, goal < 2%) over "
          f"{len(times['plain'])} steps each; the step() call itself {in_step * 1e3:.2f} ms p50 "
          f"({in_step / plain:.1%} of a step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
