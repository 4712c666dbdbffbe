"""`fatpipe data prepare`: text into llm.c-format token shards the trainer reads.

The tokenizer is the user's: a Hugging Face `tokenizers` JSON file, a tiktoken encoding whose
files are already on this machine, or `bytes` (one token per UTF-8 byte). The output folder
gets `<name>_val_000000.bin` (the first `val_share` of the text) and `<name>_train_NNNNNN.bin`
shards in llm.c's format (docs/ARCHITECTURE.md, "Shard formats"), plus a `meta.pkl` naming the
vocabulary, since llm.c's header does not. It appears whole or not at all: everything is written
in a temporary folder beside it and renamed into place at the end.
"""

from __future__ import annotations

import array
import os
import pickle
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.lazy import load
from fatpipe.trainer.data import text_files
from fatpipe.trainer.shards import LLMC_HEADER_BYTES, LLMC_MAGICS, LLMC_UINT16, LLMC_UINT32

SHARD_TOKENS = 100_000_000  # llm.c's fineweb shards hold 100M tokens
MAX_BLOCK = 1 << 18  # characters tokenized at once: memory stays bounded whatever the input
_MIN_BLOCK = 256
EOT_TEXT = "<|endoftext|>"


@dataclass(frozen=True)
class TextTokenizer:
    name: str
    vocab_size: int
    eot: int | None  # the id put before every document, as llm.c's scripts do
    encode: Callable[[str], list[int]]


def load_tokenizer(spec: str) -> TextTokenizer:
    """`bytes`, a tokenizers JSON file, or a tiktoken encoding name (files cached locally)."""
    if spec == "bytes":
        return TextTokenizer("bytes", 256, None, lambda text: list(text.encode()))
    if spec.endswith(".json") or Path(spec).is_file():
        return _hf_tokenizer(Path(spec))
    return _tiktoken(spec)


def _hf_tokenizer(path: Path) -> TextTokenizer:
    if not path.is_file():
        raise ConfigError(f"--tokenizer {path}: no such file")
    try:
        tok = load("tokenizers").Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the library's parse errors are all the same mistake
        raise ConfigError(f"--tokenizer {path}: not a tokenizers JSON file ({e})") from None
    return TextTokenizer(str(path), tok.get_vocab_size(), tok.token_to_id(EOT_TEXT),
                         lambda text: tok.encode(text, add_special_tokens=False).ids)


def _tiktoken(name: str) -> TextTokenizer:
    try:
        enc = load("tiktoken").get_encoding(name)
    except ImportError:
        raise ConfigError(f"--tokenizer {name}: not bytes, nor a tokenizers JSON file, and "
                          f"tiktoken is not installed") from None
    except Exception as e:  # noqa: BLE001 - unknown name, or its files cannot be fetched
        raise ConfigError(f"--tokenizer {name}: tiktoken encoding not available on this "
                          f"machine ({type(e).__name__}: {e})") from None
    return TextTokenizer(name, enc.n_vocab, enc.eot_token,
                         lambda text: enc.encode_ordinary(text))


@dataclass(frozen=True)
class Prepared:
    folder: Path
    files: list[Path]
    tokens: int
    vocab_size: int


def prepare(src: Path, tokenizer: TextTokenizer, out: Path, val_share: float = 0.05,
            shard_tokens: int = SHARD_TOKENS) -> Prepared:
    """Tokenize the text at `src` (a file, or a folder's text files) into shards in `out`."""
    files = [src] if src.is_file() else text_files(src) if src.is_dir() else []
    if not files:
        raise ConfigError(f"{src}: no such text file, or no text files in that folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: already exists and is not an empty folder")
    total = sum(f.stat().st_size for f in files)
    val_chars = int(total * val_share)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        writer = _ShardWriter(tmp, _prefix(src), tokenizer.vocab_size, shard_tokens)
        # Pieces of an eighth of the validation share at most: it overshoots by that much only,
        # and even a small text gets both splits.
        block = min(MAX_BLOCK, max(_MIN_BLOCK, val_chars // 8)) if val_chars else MAX_BLOCK
        for text, first in _blocks(files, block):
            writer.split = "val" if writer.chars < val_chars else "train"
            ids = tokenizer.encode(text)
            writer.add(([tokenizer.eot] if first and tokenizer.eot is not None else []) + ids,
                       len(text))
        written = writer.close()
        _write_meta(tmp, tokenizer)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide it from other users
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Prepared(out, [out / f.name for f in written], writer.tokens, tokenizer.vocab_size)


def _prefix(src: Path) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", src.stem if src.is_file() else src.name).strip("-") \
        or "data"


def _blocks(files: list[Path], size: int) -> Iterator[tuple[str, bool]]:
    """Each file's text in pieces of about `size` characters cut after a newline; True marks a
    document's first piece."""
    for path in files:
        first, rest = True, ""
        with open(path, encoding="utf-8", errors="replace") as f:
            while chunk := f.read(size):
                rest += chunk
                cut = rest.rfind("\n", 0, size) + 1 or len(rest)
                yield rest[:cut], first
                first, rest = False, rest[cut:]
        if rest:
            yield rest, first


def _write_meta(folder: Path, tokenizer: TextTokenizer) -> None:
    meta = {"vocab_size": tokenizer.vocab_size, "tokenizer": tokenizer.name}
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))


class _ShardWriter:
    """llm.c shards, each written to its final name in the (temporary) folder once complete."""

    def __init__(self, folder: Path, prefix: str, vocab_size: int, shard_tokens: int):
        self.folder, self.prefix, self.shard_tokens = folder, prefix, shard_tokens
        wide = vocab_size > 1 << 16
        self.magic, self.typecode = (LLMC_UINT32, "I") if wide else (LLMC_UINT16, "H")
        self.split, self.chars, self.tokens = "val", 0, 0
        self.files: list[Path] = []
        self._file, self._split, self._count = None, None, 0

    def add(self, ids: list[int], chars: int) -> None:
        self.chars += chars
        while ids:
            if self._file is None or self._split != self.split or self._count == self.shard_tokens:
                self._finish()
                self._open()
            take = ids[:self.shard_tokens - self._count]
            self._file.write(array.array(self.typecode, take).tobytes())
            self._count += len(take)
            self.tokens += len(take)
            ids = ids[len(take):]

    def _open(self) -> None:
        name = f"{self.prefix}_{self.split}_{len(self.files):06d}.bin"
        self.files.append(self.folder / name)
        self._file, self._split, self._count = open(self.files[-1], "wb"), self.split, 0
        self._file.write(bytes(LLMC_HEADER_BYTES))  # the header, filled in once the count is known

    def _finish(self) -> None:
        if self._file is None:
            return
        version = LLMC_MAGICS[self.magic][0]
        self._file.seek(0)
        self._file.write(struct.pack("<iii", self.magic, version, self._count))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None

    def close(self) -> list[Path]:
        self._finish()
        if not any("_train_" in f.name for f in self.files):
            raise ConfigError(f"the text is too small to split: {self.tokens} tokens, all taken "
                              f"by the validation share (try --val-share 0)")
        return self.files
