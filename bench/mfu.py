"""Tokens/s and model FLOPs utilisation (MFU) of the 124m preset on one GPU in bf16.

One process, no DDP: this is the compute the network has to keep fed. A training step is
forward + backward + fused AdamW under bf16 autocast, torch.compile'd, with TF32 matmuls for
what stays in float32. MFU = model FLOPs per token (6N + attention, PaLM appendix B) x tokens/s
over the GPU's dense bf16 peak from the table below. Goal: >= 45% on a Hopper GPU.

    .venv/bin/python bench/mfu.py [--batch-size 16] [--seq-len 1024] [--no-compile] [--out bench/out]

Without a CUDA GPU it says so and exits 0: there is nothing meaningful to measure on a CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

GOAL_HOPPER = 0.45

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, from the vendors' datasheets. The first
# entry whose key occurs in torch.cuda.get_device_name() wins, so specific names come first.
PEAK_BF16_TFLOPS = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100", 989.0),  # SXM
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.2),  # with fp32 accumulate
    ("RTX 3090", 71.0),
)
HOPPER = ("H100", "H200", "GH200", "H800")


def peak_tflops(name: str) -> float | None:
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS if key in name), None)


def measure(args) -> dict:
    from fatpipe.trainer.model import GPT, preset_config

    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    model = GPT(preset_config(args.preset, args.seq_len)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), fused=True)
    step_fn = torch.compile(model) if args.compile else model
    x = torch.randint(0, 256, (args.batch_size, args.seq_len), device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = step_fn(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    for _ in range(args.warmup):  # includes compilation
        step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(args.steps):
        step()
    end.record()
    torch.cuda.synchronize()
    step_s = begin.elapsed_time(end) / 1e3 / args.steps
    tokens_per_s = args.batch_size * args.seq_len / step_s
    flops_per_token = model.flops_per_token(args.seq_len)
    name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops or peak_tflops(name)
    return {
        "bench": "mfu", "date": time.strftime("%Y-%m-%d"), "gpu": name,
        "preset": args.preset, "params": model.num_params(), "batch_size": args.batch_size,
        "seq_len": args.seq_len, "compile": args.compile, "steps": args.steps,
        "warmup_s": warmup_s, "step_s": step_s, "tokens_per_s": tokens_per_s,
        "flops_per_token": flops_per_token, "achieved_tflops": flops_per_token * tokens_per_s / 1e12,
        "peak_tflops": peak, "mfu": flops_per_token * tokens_per_s / (peak * 1e12) if peak else None,
        "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
    }


def report(r: dict) -> str:
    lines = [f"{r['gpu']}: {r['preset']} ({r['params'] / 1e6:.0f}M params), batch "
             f"{r['batch_size']} x {r['seq_len']}, bf16, compile={r['compile']}",
             f"  {r['step_s'] * 1e3:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s, "
             f"{r['achieved_tflops']:.0f} TFLOP/s, peak memory {r['max_memory_gib']:.1f} GiB"]
    if r["mfu"] is None:
        lines.append("  MFU: unknown peak for this GPU (pass --peak-tflops)")
    else:
        lines.append(f"  MFU {r['mfu']:.1%} of {r['peak_tflops']:.0f} TFLOP/s dense bf16")
        if any(h in r["gpu"] for h in HOPPER):
            verdict = "met" if r["mfu"] >= GOAL_HOPPER else "NOT met"
            lines.append(f"  goal >= {GOAL_HOPPER:.0%} on Hopper: {verdict}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="124m", choices=("tiny", "small", "124m"))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="dense bf16 peak of a GPU missing from the table")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("bench/mfu.py: no CUDA GPU here, so there is no MFU to measure "
              "(it needs one GPU; run it on a GPU node).")
        return 0
    result = measure(args)
    print(report(result))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mfu.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out / 'mfu.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
