"""A plain PyTorch DDP script that uses fatpipe's API: a small byte-level transformer on text.

Run it as any DDP script:

    torchrun --nproc-per-node 2 examples/ddp_script.py --steps 50     # on one machine
    fatpipe up -- examples/ddp_script.py --steps 50                   # across a cluster

Under `fatpipe up`/`launch` the three lines marked `fatpipe:` apply the run's `comm` (comm=auto
picks a gradient compression the measured link can afford) and record every step into the run
folder, so `fatpipe top`, `fatpipe report` and the run's summary show this script as they show
the built-in trainer. Under plain torchrun they are plain DDP and record nothing. Remove them
and this is an ordinary DDP script: nothing else here knows about fatpipe.

Data: the text of Python's own standard library (no download), a different window per rank
and step. gloo on CPUs, NCCL on GPUs.
"""

from __future__ import annotations

import argparse
import os
import sysconfig
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import fatpipe.trainer.api as fatpipe  # fatpipe: 1 of 3


class TinyLM(nn.Module):
    """A next-byte predictor: embeddings, a causal transformer encoder, a linear head."""

    def __init__(self, seq_len: int, width: int = 128, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Parameter(torch.zeros(seq_len, width))
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 256)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.position[: x.shape[1]]
        return self.head(self.blocks(h, mask=self.causal[: x.shape[1], : x.shape[1]], is_causal=True))


def corpus(limit: int = 4 << 20) -> torch.Tensor:
    """Bytes of the standard library's .py files, in a fixed order (the same on every node)."""
    data = bytearray()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data += path.read_bytes()
        if len(data) >= limit:
            break
    return torch.frombuffer(data, dtype=torch.uint8).long()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()

    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous; fatpipe also names the
    # interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME) that carries the private network.
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = TinyLM(args.seq_len).to(device)
    # fatpipe: 2 of 3. Plain DDP would be: model = DistributedDataParallel(model)
    model = fatpipe.wrap(model, steps=args.steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    data = corpus()
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own windows
    for _ in range(args.steps):
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=gen)
        window = torch.stack([data[s: s + args.seq_len + 1] for s in starts.tolist()]).to(device)
        x, y = window[:, :-1], window[:, 1:]
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()  # DDP synchronises the gradients here, through fatpipe's comm hook
        optimizer.step()
        fatpipe.step(loss, tokens=x.numel())  # fatpipe: 3 of 3 (after optimizer.step())
        optimizer.zero_grad(set_to_none=True)

    if rank == 0:
        print(f"done: {args.steps} steps on {world} ranks, last loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
