"""The `[data]` table of fatpipe.toml: a dataset every node gets, where it comes from and where it lands.

Project-wide (`[data]`) or per cluster (`[clusters.<name>.data]`, which wins). docs/ARCHITECTURE.md,
"The data contract", says where the data and its manifest land on a node.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pydantic import Field, model_validator

from .trainspec import Strict

MANIFEST_NAME = ".fatpipe-manifest.json"  # beside the data on every node (inside a staged folder)
LOCAL_MANIFEST = "data-manifest.json"  # the operator's copy, in .fatpipe/<cluster>/
CHUNK_SIZE = 64 << 20  # bytes per chunk: what the fan-out sends and what a node may lack alone
REMOTE_SCHEMES = ("s3://", "https://", "http://")
UNSAFE = "*?[]\\"  # rsync's pattern characters: the path becomes an exclude pattern


class DataSpec(Strict):
    """A local file or folder, staged into the project folder of every node at `path`."""

    source: str = Field(min_length=1)
    path: str | None = None  # relative to the project folder on a node; default: the source's own
    chunk_mib: int = Field(CHUNK_SIZE >> 20, ge=1, le=1024)

    @model_validator(mode="after")
    def _source_and_path(self) -> DataSpec:
        if self.source.startswith(REMOTE_SCHEMES) or "://" in self.source:
            raise ValueError(f"source {self.source!r}: only a local file or folder is supported so far "
                             "(s3:// and https:// sources are not built yet)")
        if self.path is None:
            outside = self.source.startswith("~") or Path(self.source).is_absolute() or \
                ".." in PurePosixPath(self.source).parts
            if outside:
                raise ValueError(f"source {self.source!r} lies outside the project folder: give path = \"...\", "
                                 "where it lands in every node's project folder (for example \"data/train\")")
            self.path = self.source
        self.path = landing_path(self.path)
        return self

    @property
    def chunk_size(self) -> int:
        return self.chunk_mib << 20

    def source_path(self, project_root: Path) -> Path:
        """The source on this machine (a relative one is relative to the project folder)."""
        return (Path(project_root) / Path(self.source).expanduser()).resolve()


def landing_path(path: str) -> str:
    """`path` normalised, or ValueError when it would leave the project folder or name nothing."""
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise ValueError(f"path {path!r} must be relative to the project folder on the nodes, not absolute")
    parts = [p for p in pure.parts if p != "."]
    if not parts or ".." in parts:
        what = "names no file" if not parts else "leaves the project folder (..)"
        raise ValueError(f"path {path!r} {what}; give a path inside it such as \"data/train\"")
    odd = sorted({c for c in path if c in UNSAFE or not c.isprintable()})
    if odd:
        raise ValueError(f"path {path!r} holds {''.join(odd)!r}; use letters, digits and . _ - / (rsync reads "
                         "the rest as patterns)")
    if parts[0] in (".fatpipe", ".git"):
        raise ValueError(f"path {path!r} lies in {parts[0]}/, which fatpipe or git own; choose another folder")
    return "/".join(parts)


def cluster_data(spec, cluster_name: str) -> DataSpec | None:
    """The dataset a cluster gets: its own `[clusters.<name>.data]`, else the project's `[data]`."""
    cluster = spec.clusters.get(cluster_name)
    own = getattr(cluster, "data", None) if cluster is not None else None
    return own or getattr(spec, "data", None)
