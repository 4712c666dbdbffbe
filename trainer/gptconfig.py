"""The GPT's presets and the shapes of its parameters, without torch.

`fatpipe plan` prices a preset's gradient (its bytes, and what PowerSGD would send of them) from
these shapes on a machine that needs no torch; `model.GPT` builds the same parameters (a unit
test holds the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int = 256  # longest sequence the position table covers
    vocab_size: int = 256
    dropout: float = 0.0


_PRESETS = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128),  # ~0.8M parameters: tests
    "small": dict(n_layer=8, n_head=8, n_embd=512),  # ~25M: where 1 Gbit/s links start to hurt
    "124m": dict(n_layer=12, n_head=12, n_embd=768),  # GPT-2 small
}
GPT2_PADDED_VOCAB = 50304  # GPT-2's 50257 ids rounded up to a multiple of 64
GPT2_CONTEXT = 1024
DEFAULT_SEQ_LEN = 256


def preset_config(name: str, block_size: int, vocab_size: int = 256) -> GPTConfig:
    """The GPTConfig of a preset, with a position table of `block_size` tokens and room for
    `vocab_size` token ids (rounded up to a multiple of 64, for the matmul kernels)."""
    vocab = -(-vocab_size // 64) * 64
    if name == "124m":
        vocab, block_size = max(vocab, GPT2_PADDED_VOCAB), max(block_size, GPT2_CONTEXT)
    return GPTConfig(block_size=block_size, vocab_size=vocab, **_PRESETS[name])


def default_seq_len(preset: str, gpt2_tokens: bool) -> int:
    """Tokens per sequence when none is set: GPT-2's context for `124m` on GPT-2 tokens."""
    return GPT2_CONTEXT if preset == "124m" and gpt2_tokens else DEFAULT_SEQ_LEN


def parameter_shapes(cfg: GPTConfig) -> list[tuple[int, ...]]:
    """The shapes of `model.GPT(cfg).parameters()`, in its order (the output projection is the
    token embedding, one parameter)."""
    e = cfg.n_embd
    block = [(e,), (e,), (3 * e, e), (e, e), (e,), (e,), (4 * e, e), (e, 4 * e)]
    return [(cfg.vocab_size, e), (cfg.block_size, e), *block * cfg.n_layer, (e,), (e,)]
