"""Token shards on disk: nanoGPT's raw uint16 `.bin` and llm.c's headered shards, memory-mapped.

Formats (docs/ARCHITECTURE.md, "Shard formats"):
- llm.c: a header of 256 little-endian int32 (magic, version, token count), then the tokens:
  magic 20240520 (version 1) holds uint16 GPT-2 tokens, 20240801 (version 7) uint32 tokens.
- nanoGPT: the tokens alone, uint16; the vocabulary from `meta.pkl` beside it when present,
  else GPT-2's (what nanoGPT's own prepare scripts write without one).
Each shard is mapped (torch.from_file, a private mapping), so a rank's pages load only as its
own windows touch them. Only torch and the standard library: the nodes' venvs hold little else.
"""

from __future__ import annotations

import json
import pickle
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError

LLMC_HEADER_BYTES = 256 * 4
GPT2_VOCAB = 50257  # GPT-2's tokenizer; 50304 once padded to a multiple of 64
LLAMA3_VOCAB = 128256
LLMC_UINT16, LLMC_UINT32 = 20240520, 20240801
# magic -> (version, bytes per token, vocabulary without a meta.pkl), as llm.c's dev/data writes
LLMC_MAGICS = {LLMC_UINT16: (1, 2, GPT2_VOCAB), LLMC_UINT32: (7, 4, LLAMA3_VOCAB)}
# llm.c's shard names (fineweb_train_000001.bin, tiny_shakespeare_val.bin): always headered.
_LLMC_NAME = re.compile(r".+_(train|val)(_\d+)?\.bin$")
_VAL_NAME = re.compile(r"(^val\.bin$)|(.+_val(_\d+)?\.bin$)")
_SAFE_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes",
                  "bool", "complex"}
SCAN_TOKENS = 1 << 22  # tokens per chunk of the vocabulary scan (16 MiB as int32)


class DataError(ConfigError):
    """Data the trainer cannot read as stated; the entry point prints it as one line, exit 2."""


@dataclass(frozen=True)
class Shard:
    """One file's tokens: a flat memory-mapped tensor read as unsigned through `mask`."""

    name: str
    tokens: torch.Tensor  # uint8, or int16/int32 holding uint16/uint32 bit patterns
    mask: int

    def __len__(self) -> int:
        return len(self.tokens)

    def read(self, start: int, length: int) -> torch.Tensor:
        """Tokens [start, start + length) as int64 ids."""
        return self.tokens[start:start + length].long() & self.mask


def byte_shard(name: str, data: torch.Tensor) -> Shard:
    return Shard(name, data, 0xFF)


def is_token_file(path: Path) -> bool:
    return path.suffix == ".bin"


def is_val_file(path: Path) -> bool:
    return bool(_VAL_NAME.match(path.name))


def llmc_magic(path: Path) -> int | None:
    """The llm.c magic a file starts with, or None."""
    with open(path, "rb") as f:
        head = f.read(4)
    magic = struct.unpack("<i", head)[0] if len(head) == 4 else None
    return magic if magic in LLMC_MAGICS else None


def open_token_files(files: list[Path]) -> tuple[list[Shard], int, str]:
    """Map token shards of one format; returns them, the vocabulary the data declares and the
    format ("llm.c" or "nanoGPT").

    The first file decides the format: llm.c when it starts with a known magic, else nanoGPT.
    """
    magic = llmc_magic(files[0])
    if magic is None:
        for f in files[1:]:
            if llmc_magic(f) is not None:
                raise DataError(f"{f}: an llm.c shard beside {files[0].name}, which has no "
                                f"llm.c header: one format per dataset")
    shards = [_open_llmc(f) if magic is not None else _open_raw(f) for f in files]
    vocab = _meta_vocab(files[0].parent)
    if vocab is None:
        vocab = LLMC_MAGICS[magic][2] if magic is not None else GPT2_VOCAB
    return shards, vocab, "llm.c" if magic is not None else "nanoGPT"


def _open_llmc(path: Path) -> Shard:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(LLMC_HEADER_BYTES)
    magic = struct.unpack("<i", head[:4])[0] if len(head) >= 4 else None
    if len(head) < LLMC_HEADER_BYTES or magic not in LLMC_MAGICS:
        shown = "none" if magic is None else magic
        raise DataError(f"{path}: bad magic {shown} (an llm.c shard starts with "
                        f"{' or '.join(str(m) for m in LLMC_MAGICS)})")
    version, width, _ = LLMC_MAGICS[magic]
    got_version, count = struct.unpack("<ii", head[4:12])
    if got_version != version:
        raise DataError(f"{path}: llm.c magic {magic} with version {got_version}, "
                        f"expected {version}")
    held = (size - LLMC_HEADER_BYTES) // width
    if (size - LLMC_HEADER_BYTES) % width or held != count or count < 1:
        raise DataError(f"{path}: the header says {count} tokens of {width} bytes, the file "
                        f"holds {size - LLMC_HEADER_BYTES} bytes after it")
    return _mapped(path, size, width, LLMC_HEADER_BYTES // width)


def _open_raw(path: Path) -> Shard:
    size = path.stat().st_size
    if _LLMC_NAME.match(path.name):  # named like llm.c's shards, so it must carry the header
        _open_llmc(path)
    if size == 0:
        raise DataError(f"{path}: the file is empty")
    if size % 2:
        raise DataError(f"{path}: odd byte count {size}: not uint16 tokens "
                        f"(nanoGPT's .bin), nor an llm.c shard")
    return _mapped(path, size, 2, 0)


def _mapped(path: Path, size: int, width: int, skip: int) -> Shard:
    dtype, mask = (torch.int16, 0xFFFF) if width == 2 else (torch.int32, 0xFFFFFFFF)
    # A private mapping: nothing is read until a window touches its pages.
    whole = torch.from_file(str(path), shared=False, size=size // width, dtype=dtype)
    return Shard(str(path), whole[skip:], mask)


class _BuiltinsOnly(pickle.Unpickler):
    """meta.pkl is a dict of plain values; any other global (code, objects) is refused."""

    def find_class(self, module: str, name: str):
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")


def _meta_vocab(folder: Path) -> int | None:
    """vocab_size from nanoGPT's meta.pkl in `folder`, read without running any code."""
    meta = folder / "meta.pkl"
    if not meta.is_file():
        return None
    try:
        with open(meta, "rb") as f:
            data = _BuiltinsOnly(f).load()
    except Exception as e:  # noqa: BLE001 - any unreadable pickle is the same user error
        raise DataError(f"{meta}: not a readable meta.pkl ({e})") from None
    vocab = data.get("vocab_size") if isinstance(data, dict) else None
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise DataError(f"{meta}: no positive integer vocab_size in it")
    return vocab


def first_bad_id(shards: list[Shard], vocab: int, rank: int, world_size: int) -> str | None:
    """The first id >= `vocab` in this rank's share of the scan, as an error line, or None.

    The shards are cut into chunks of SCAN_TOKENS dealt round-robin to the ranks, so the
    cluster reads the data once between them and no rank holds more than one chunk.
    """
    n = 0
    for shard in shards:
        for start in range(0, len(shard), SCAN_TOKENS):
            mine, n = n % world_size == rank, n + 1
            if not mine:
                continue
            chunk = shard.read(start, SCAN_TOKENS)
            bad = (chunk >= vocab).nonzero()
            if len(bad):
                at = int(bad[0, 0])
                return (f"{shard.name}: token id {int(chunk[at])} at token {start + at} is past "
                        f"the vocabulary of {vocab} ids")
    return None


# A folder staged by `fatpipe data push` lists its files here (trainer.staging.manifest keeps the
# same name): the trainer reads only those, never a file left beside them.
MANIFEST_NAME = ".fatpipe-manifest.json"


def listed_only(folder: Path, files: list[Path]) -> list[Path]:
    """`files` that the folder's staging manifest lists, when it has one; else all of them."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        return files
    except (OSError, ValueError) as e:
        raise DataError(f"--data {folder}: its {MANIFEST_NAME} is unreadable ({e}); `fatpipe data push` "
                        "writes it again") from None
    listed = {f["name"] for f in manifest.get("files", [])}
    return [f for f in files if f.relative_to(folder).as_posix() in listed]
