"""`fatpipe data prepare SRC --tokenizer T --out DIR`: text into llm.c-format token shards."""

from __future__ import annotations

from pathlib import Path

import click

from fatpipe.ops.data.prepare import SHARD_TOKENS, load_tokenizer
from fatpipe.ops.data.prepare import prepare as prepare_shards

from .options import console


@click.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--tokenizer", "tokenizer_spec", required=True, metavar="T",
              help="bytes, a tokenizers (Hugging Face) JSON file, or a tiktoken encoding name "
                   "whose files are on this machine.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Folder to create (absent or empty) for the shards and meta.pkl.")
@click.option("--val-share", type=click.FloatRange(0, 0.5), default=0.05, show_default=True,
              help="Share of the text, from its start, that goes to the validation shard.")
@click.option("--shard-tokens", type=click.IntRange(1), default=None,
              help="Tokens per shard (default 100M, as llm.c's).")
def prepare(src: Path, tokenizer_spec: str, out: Path, val_share: float,
            shard_tokens: int | None):
    """Tokenize a text file or a folder of text files into shards `[train] data` can name."""
    tokenizer = load_tokenizer(tokenizer_spec)
    done = prepare_shards(src, tokenizer, out, val_share, shard_tokens or SHARD_TOKENS)
    console().print(f"{done.folder}: {done.tokens:,} tokens in {len(done.files)} shard(s), "
                    f"vocabulary {done.vocab_size:,} ({tokenizer.name})",
                    markup=False, highlight=False)
